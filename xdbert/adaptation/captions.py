"""The caption-text control's windows (`adapt.text: captions`): the caption corpus in the token shards' layout,
mixed with corpus windows.

The captions (data/captions/captions.json, what the `captions` stage wrote from `grounding.captions`) are one
document, a caption a line, and the dual tokenizer cuts it as it cuts a corpus document: CLIP's cleaning, the
WordPiece of models/tokenizer, windows of `tokenize.max_len` cut only at word starts. So every window but the
last is as full as a corpus window, and holds caption text alone. The tokenizer lays out CLIP blocks too; the
control never reads them (`text: captions` has no cross layers: xdbert.adaptation.settings).

The control reads corpus windows beside the captions, at the CLIP stand-in's `mechanism.caption_share`
(`with_corpus`): trained on captions alone, its MLM accuracy on corpus windows fell to 0.22 against the
baseline's 0.61 (issue 68), and the `vis` task, whose sentences are corpus-style, read a damaged encoder.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from xdbert.data.caption_mix import corpus_rows
from xdbert.data.shards import COLUMNS, ShardDataset
from xdbert.data.tokenization.dual import DualTokenizer
from xdbert.data.tokenization.windows import Layout


def layout_of(manifest: dict) -> Layout:
    """The sizes and special ids of the shards a manifest describes (`xdbert.data.shards.build_manifest`)."""
    bert, clip = manifest["bert_tokenizer"], manifest["clip_tokenizer"]
    return Layout(max_len=manifest["max_len"], n_blocks=manifest["n_blocks"], cls_id=bert["cls_id"],
                  sep_id=bert["sep_id"], pad_id=bert["pad_id"], sot_id=clip["sot_id"], eot_id=clip["eot_id"],
                  bert_vocab_size=bert["vocab_size"])


def caption_windows(captions: Sequence[str], manifest: dict, bert_json: str, clip_json: str) -> ShardDataset:
    """`captions`, in order, packed into windows of the shards `manifest` describes: a split in memory that the
    adaptation loop reads as it reads a shard split. `bert_json`, `clip_json`: the tokenizers the shards were
    made with, as `tokenizers` JSON. Its manifest holds the sizes and a hash of the windows (the checkpoint's
    fingerprint: other captions never resume a run)."""
    if not captions:
        raise ValueError("no captions to pack into windows")
    # a line each: CLIP's cleaning fixes text line by line, and turns the line breaks into single spaces
    windows = DualTokenizer(bert_json, clip_json, layout_of(manifest)).encode(["\n".join(captions)])
    return _in_memory([windows.rows()], manifest)


def with_corpus(captions: ShardDataset, corpus: ShardDataset, caption_share: float) -> ShardDataset:
    """Every window of `captions`, then windows of `corpus` in order (wrapping round) so that the captions are
    `caption_share` of the whole (`data.caption_mix.corpus_rows`, as the CLIP stand-in mixes its blocks)."""
    caption_part = captions[np.arange(len(captions))]
    corpus_part = corpus[corpus_rows(len(captions), len(corpus), caption_share)]
    return _in_memory([{k: part[k] for k in COLUMNS} for part in (caption_part, corpus_part)], captions.manifest)


def _in_memory(parts: list[dict[str, np.ndarray]], manifest: dict) -> ShardDataset:
    """A split in memory from row columns; its manifest holds the sizes and a hash of the windows (the
    checkpoint's fingerprint: other windows never resume a run)."""
    digest = hashlib.sha256()
    for rows in parts:
        for name in COLUMNS:
            digest.update(rows[name].tobytes())
    return ShardDataset(None, "captions", {"max_len": manifest["max_len"], "n_blocks": manifest["n_blocks"],
                                           "content_sha256": digest.hexdigest()}, parts)
