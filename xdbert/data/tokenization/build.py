"""The `dual_tokenize` stage's work: the BERT tokenizer, both corpus splits as shards, validation, manifest.

`Settings` is the `tokenize` params section, checked; `Inputs` adds the checked `model` values the
stage reads. `build` writes `models/tokenizer` and `data/shards` together, in one step at the end,
after re-checking sampled windows against the reference tokenizers (`validate_split`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import Tokenizer

from xdbert import params as P
from xdbert.data.shards import ShardWriter, build_manifest, open_shards
from xdbert.data.tokenization.cleaning import clean_text
from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
from xdbert.data.tokenization.pool import DualPool, clean_docs
from xdbert.data.tokenization.saving import save_tokenizer
from xdbert.data.tokenization.vocab import (check_positions, clip_vocab_hash, encoder_positions,
                                            load_encoder_tokenizer, train_wordpiece, vocab_hash)
from xdbert.data.tokenization.windows import (CLIP_CONTENT, CLIP_CONTEXT, Layout, Windows, alignment_problem,
                                              clip_blocks, clip_content)
from xdbert.errors import PipelineError
from xdbert.io import atomic_path, read_parquet, write_json
from xdbert.random_encoder import RANDOM_PREFIX

MIN_MAX_LEN = 8
INT16_MAX = 2**15 - 1  # bert_len and the alignment are stored as int16
# The manifest's description of the cleaning. It is part of data/shards, which every later stage depends
# on, so it keeps the module path it was first written with (`clean_text` is in `cleaning`).
CLEANING = "xdbert.tokenization.clean_text (CLIP's basic_clean + whitespace_clean, special strings removed)"


TOKENIZE_KEYS = ("vocab_size", "max_len", "n_blocks", "shard_windows", "max_overflow", "validate_windows", "workers")


@dataclass(frozen=True)
class Settings:
    """The `tokenize` params section, checked (a key not in TOKENIZE_KEYS refused)."""

    vocab_size: int
    max_len: int
    n_blocks: int
    shard_windows: int
    max_overflow: float
    validate_windows: int
    workers: int

    @classmethod
    def from_params(cls, sec: dict) -> "Settings":
        P.check_keys(sec, "tokenize", TOKENIZE_KEYS)
        get = P.getter(sec, "tokenize")

        max_len = P.positive(get("max_len"), "tokenize.max_len")
        if not MIN_MAX_LEN <= max_len <= INT16_MAX:
            raise PipelineError(f"`tokenize.max_len` must be between {MIN_MAX_LEN} ([CLS] + 6 tokens + [SEP]) and {INT16_MAX} (alignment positions are int16); got {max_len}")
        n_blocks = P.positive(get("n_blocks"), "tokenize.n_blocks")
        if n_blocks * CLIP_CONTEXT > INT16_MAX:
            raise PipelineError(f"`tokenize.n_blocks` must be at most {INT16_MAX // CLIP_CONTEXT} (alignment positions are int16); got {n_blocks}")
        validate = P.non_negative(get("validate_windows"), "tokenize.validate_windows")
        return cls(
            vocab_size=P.positive(get("vocab_size"), "tokenize.vocab_size"),
            max_len=max_len,
            n_blocks=n_blocks,
            shard_windows=P.positive(get("shard_windows"), "tokenize.shard_windows"),
            max_overflow=P.fraction(get("max_overflow"), "tokenize.max_overflow"),
            validate_windows=validate,
            workers=P.positive(get("workers"), "tokenize.workers"),
        )


def corpus_paths(corpus_dir: str | Path) -> dict[str, Path]:
    """data/corpus/{train,valid}.parquet, which must exist."""
    paths = {s: Path(corpus_dir) / f"{s}.parquet" for s in ("train", "valid")}
    for p in paths.values():
        if not p.is_file():
            raise PipelineError(f"missing corpus file {p}: run `dvc repro corpus` first")
    return paths


def read_corpus(path: Path) -> list[str]:
    """The `text` column of a corpus split (one document per row)."""
    table = read_parquet(path, "rerun `dvc repro corpus`")
    if "text" not in table.column_names:
        raise PipelineError(f"corpus file {path} has no `text` column (it has {table.column_names}): rerun `dvc repro corpus`")
    return [t or "" for t in table.column("text").to_pylist()]


@dataclass(frozen=True)
class Inputs:
    """What `build` reads from the params, checked: `model.encoder`, `model.clip`, the `tokenize`
    settings, the encoder's positions and, for a hub id or folder, its tokenizer (fetched here)."""

    encoder: str
    clip_name: str
    settings: Settings
    positions: int | None
    encoder_tokenizer: Any

    @staticmethod
    def read(params: dict) -> tuple[str, str, Settings, int | None]:
        """(encoder, clip, settings, positions): every param the stage reads, checked, touching no file. The
        positions are a `random:` encoder's (from its config, `model.encoder_config`); a pretrained
        encoder's come from the hub, in `check`."""
        model = P.section(params, "model")
        sec = P.section(params, "tokenize")
        encoder = P.get(model, "encoder", "model")
        clip = P.get(model, "clip", "model")
        if not isinstance(encoder, str) or not encoder.strip():
            raise PipelineError(f"`model.encoder` must be a hub id, a folder or random:<model_type>; got {encoder!r}")
        settings = Settings.from_params(sec)
        positions = encoder_positions(encoder, model.get("encoder_config")) if encoder.startswith(RANDOM_PREFIX) else None
        return encoder, clip, settings, positions

    @classmethod
    def check(cls, encoder: str, clip: str, settings: Settings, positions: int | None,
              corpus_dir: str | Path) -> "Inputs":
        """What only files and libraries can tell: the open_clip name, the corpus, a pretrained encoder's tokenizer
        and positions, and that `tokenize.max_len` fits them."""
        from xdbert.clip import check_name  # imports open_clip and torch: after the quick checks

        check_name(clip)
        corpus_paths(corpus_dir)
        tokenizer = None if encoder.startswith(RANDOM_PREFIX) else load_encoder_tokenizer(encoder)
        if tokenizer is not None:
            positions = encoder_positions(encoder, None, tokenizer)  # a pretrained encoder's config: no overrides
        check_positions("tokenize.max_len", settings.max_len, positions, encoder)
        return cls(encoder=encoder, clip_name=clip, settings=settings, positions=positions, encoder_tokenizer=tokenizer)


@dataclass
class SplitResult:
    """Counts of one split while its windows stream to the shards, plus what validation needs."""

    windows: int = 0
    docs: int = 0
    overflow: int = 0
    dropped_words: int = 0
    unaligned: int = 0
    unaligned_example: str | None = None
    doc_index: list = field(default_factory=list)
    char_span: list = field(default_factory=list)
    clip_tokens: list = field(default_factory=list)

    def add(self, w: Windows) -> None:
        self.windows += len(w)
        self.docs += w.docs
        self.overflow += int(w.overflow.sum())
        self.dropped_words += w.dropped_words
        self.unaligned += w.unaligned
        self.unaligned_example = self.unaligned_example or w.unaligned_example
        self.doc_index.append(w.doc_index)
        self.char_span.append(w.char_span)
        self.clip_tokens.append(w.clip_tokens)


def build(*, corpus_dir: str | Path, shard_dir: str | Path, tokenizer_dir: str | Path, encoder: str, clip_name: str,
          settings: Settings, positions: int | None, encoder_tokenizer=None) -> dict:
    """Train or fetch the BERT tokenizer, dual-tokenize both corpus splits into shards, validate, write
    the manifest. `shard_dir` and `tokenizer_dir` are replaced together at the end or not at all.
    Returns a summary (windows and overflow share per split, MB/s)."""
    from transformers import AutoTokenizer

    from xdbert.clip import clip_tokenizer

    paths = corpus_paths(corpus_dir)
    raw = {s: read_corpus(p) for s, p in paths.items()}
    n_bytes = sum(len(t.encode("utf-8")) for docs in raw.values() for t in docs)
    reference_clip = clip_tokenizer(clip_name)

    with atomic_path(tokenizer_dir, is_dir=True) as tok_tmp, atomic_path(shard_dir, is_dir=True) as shard_tmp:
        cleaned: dict[str, list[str]] = {}
        t_clean = 0.0
        if encoder.startswith(RANDOM_PREFIX):
            t0 = time.perf_counter()
            cleaned["train"] = clean_docs(raw["train"], settings.workers)
            t_clean = time.perf_counter() - t0
            bert = train_wordpiece(cleaned["train"], settings.vocab_size, positions or settings.max_len)
        else:
            bert = encoder_tokenizer if encoder_tokenizer is not None else load_encoder_tokenizer(encoder)
        save_tokenizer(bert, tok_tmp)
        bert = AutoTokenizer.from_pretrained(str(tok_tmp))  # exactly what the later stages will load
        ids = {k: getattr(bert, f"{k}_token_id", None) for k in ("cls", "sep", "pad")}
        if None in ids.values():
            raise PipelineError(f"the tokenizer of `model.encoder: {encoder}` lacks a [CLS]/[SEP]/[PAD] token ({ids}); a BERT-style tokenizer is needed")
        layout = Layout(max_len=settings.max_len, n_blocks=settings.n_blocks, cls_id=ids["cls"], sep_id=ids["sep"],
                        pad_id=ids["pad"], sot_id=reference_clip.sot_token_id, eot_id=reference_clip.eot_token_id,
                        bert_vocab_size=len(bert))
        backend = Tokenizer.from_str(bert.backend_tokenizer.to_str())
        bert_json, clip_json = backend.to_str(), clip_fast_tokenizer(clip_name).to_str()

        t1 = time.perf_counter()
        results: dict[str, SplitResult] = {}
        records: dict[str, list] = {}
        with DualPool(bert_json, clip_json, layout, settings.workers) as pool:
            for split in ("train", "valid"):
                writer = ShardWriter(shard_tmp, split, settings.shard_windows, settings.max_len, settings.n_blocks, len(bert))
                res = results[split] = SplitResult()
                docs = cleaned.get(split, raw[split])
                for win in pool.windows(docs, clean=split not in cleaned):
                    writer.add(win.rows())
                    res.add(win)
                    check_overflow_early(split, res, settings)
                records[split] = writer.close()
                _check_split(split, res, paths[split], settings)
        seconds = t_clean + time.perf_counter() - t1  # cleaning and dual tokenization, not vocabulary training

        splits = {s: {"windows": r.windows, "documents": r.docs, "shards": records[s], "overflow_windows": r.overflow,
                      "overflow_share": r.overflow / r.windows, "dropped_words": r.dropped_words}
                  for s, r in results.items()}
        bert_info = {"name": encoder, "path": str(tokenizer_dir), "class": type(bert).__name__, "vocab_size": len(bert),
                     "vocab_sha256": vocab_hash(bert.get_vocab()), **{f"{k}_id": v for k, v in ids.items()},
                     "mask_id": bert.mask_token_id}
        clip_info = {"model": clip_name, "vocab_size": reference_clip.vocab_size, "vocab_sha256": clip_vocab_hash(reference_clip),
                     "sot_id": layout.sot_id, "eot_id": layout.eot_id}
        manifest = build_manifest(max_len=settings.max_len, n_blocks=settings.n_blocks, bert=bert_info, clip=clip_info,
                                  splits=splits, extra={"cleaning": CLEANING})
        write_json(shard_tmp / "manifest.json", manifest)

        checked = {}
        for split, res in results.items():
            ds = open_shards(shard_tmp, split, verify=True)
            checked[split] = validate_split(ds, split, raw[split], res, bert, reference_clip, layout, settings.validate_windows)
        manifest["validated_windows"] = checked
        write_json(shard_tmp / "manifest.json", manifest)

    return {"windows": {s: r.windows for s, r in results.items()},
            "overflow_share": {s: r.overflow / r.windows for s, r in results.items()},
            "shards": sum(len(v) for v in records.values()), "megabytes": n_bytes / 1e6, "seconds": seconds,
            "mb_per_s": n_bytes / 1e6 / max(seconds, 1e-9), "validated": checked}


# The early overflow check: wiki103's train split is hours of tokenization at paper sizes, so a share of
# overflowing windows that is already surely above the limit stops the stage then, not at the split's end.
EARLY_MIN_WINDOWS = 5_000
EARLY_CONFIDENCE = 0.99


def overflow_lower_bound(overflow: int, windows: int, confidence: float = EARLY_CONFIDENCE) -> float:
    """One-sided lower confidence bound of the overflow share (Clopper-Pearson: exact for a binomial count)."""
    from scipy.stats import beta

    return 0.0 if overflow == 0 else float(beta.ppf(1 - confidence, overflow, windows - overflow + 1))


def check_overflow_early(split: str, res: SplitResult, settings: Settings) -> None:
    """Stop when, after at least EARLY_MIN_WINDOWS windows, even the share's 99% lower bound exceeds the limit."""
    if res.windows < EARLY_MIN_WINDOWS or res.overflow / res.windows <= settings.max_overflow:
        return
    bound = overflow_lower_bound(res.overflow, res.windows)
    if bound > settings.max_overflow:
        _overflow_error(split, res, settings, f"stopped early: its {EARLY_CONFIDENCE:.0%} lower bound is {bound:.2%}; ")


def _overflow_error(split: str, res: SplitResult, settings: Settings, early: str = "") -> None:
    raise PipelineError(
        f"{res.overflow / res.windows:.2%} of the {split} windows ({res.overflow} of {res.windows}) have more CLIP tokens than "
        f"tokenize.n_blocks x 75 = {settings.n_blocks * CLIP_CONTENT}, above tokenize.max_overflow = {settings.max_overflow:.2%} "
        f"({early}nothing was written): raise tokenize.n_blocks or lower tokenize.max_len")


def _check_split(split: str, res: SplitResult, path: Path, settings: Settings) -> None:
    if res.windows == 0:
        raise PipelineError(f"corpus file {path} gives no windows ({res.docs} documents, none with text): rerun `dvc repro corpus` or check its params")
    if res.overflow / res.windows > settings.max_overflow:
        _overflow_error(split, res, settings)
    if res.unaligned:
        raise PipelineError(f"{res.unaligned} BERT tokens of the {split} windows have no CLIP tokens although their text was not cut off, e.g. {res.unaligned_example}")


def validation_sample(res: SplitResult, n: int) -> list[int]:
    """`n` windows to re-check, but at least two (the first and the longest text) when `n` > 0; deterministic:
    the first, the longest text, the most CLIP tokens, then random."""
    if n <= 0 or res.windows == 0:
        return []
    spans = np.concatenate(res.char_span)
    clip_tokens = np.concatenate(res.clip_tokens)
    picks = [0, int(np.argmax(spans[:, 1] - spans[:, 0])), int(np.argmax(clip_tokens))]
    picks += np.random.default_rng(0).permutation(res.windows)[:n].tolist()
    return list(dict.fromkeys(picks))[:max(n, 2)]


def validate_split(ds, split: str, raw_docs: Sequence[str], res: SplitResult, bert_reference, clip_reference,
                   layout: Layout, n: int) -> int:
    """Re-tokenize sampled windows with the reference tokenizers and compare with the written shards.

    BERT: the transformers tokenizer (with specials) on the window text; CLIP: open_clip's
    SimpleTokenizer.encode, laid out in blocks exactly as the pipeline does; plus the alignment's
    sanity. Raises PipelineError with the first differing window's text and both id lists.
    """
    picks = validation_sample(res, n)
    doc_index = np.concatenate(res.doc_index)
    spans = np.concatenate(res.char_span)
    cleaned: dict[int, str] = {}
    for i in picks:
        d = int(doc_index[i])
        if d not in cleaned:
            cleaned[d] = clean_text(raw_docs[d])
        text = cleaned[d][spans[i, 0]:spans[i, 1]]
        row = ds[i]
        where = f"validation of {split} window {i} (document {d})"
        k = int(row["bert_len"])
        ours = row["bert_ids"][:k].tolist()
        ref = bert_reference(text)["input_ids"]
        if ours != ref or (row["bert_ids"][k:] != layout.pad_id).any():
            raise PipelineError(f"{where}: BERT ids differ from the reference tokenizer; text={text!r} pipeline={ours} reference={ref}")
        ours_clip = clip_content(row["clip_ids"], layout.eot_id)
        ref_clip = clip_reference.encode(text)
        expected_row, kept = clip_blocks(ref_clip, layout)
        if ours_clip != ref_clip[:kept] or not np.array_equal(row["clip_ids"], expected_row):
            raise PipelineError(f"{where}: CLIP ids differ from open_clip's SimpleTokenizer.encode; text={text!r} pipeline={ours_clip} reference={ref_clip}")
        problem = alignment_problem(row["align_start"], row["align_end"], k, truncated=kept < len(ref_clip), layout=layout)
        if problem:
            raise PipelineError(f"{where}: alignment {problem}; text={text!r} align_start={row['align_start'][:k].tolist()} align_end={row['align_end'][:k].tolist()}")
    return len(picks)
