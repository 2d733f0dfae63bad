"""The folder the adapt stage reads, built small for the tests (tests/test_adaptation.py, test_caption_mlm.py):
as the corpus, dual_tokenize, pretrain_encoder@bert and captions stages leave it."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer

from xdbert.data.captions import write_coco_captions
from xdbert.data.corpus import write_corpus
from xdbert.data.synthetic.documents import generate_corpus
from xdbert.data.synthetic.words import generate_captions
from xdbert.data.tokenization.build import Settings as TokenizeSettings
from xdbert.data.tokenization.build import build as dual_tokenize
from xdbert.model.encoders import build_masked_lm

CLIP = "xdbert-tiny"
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
             "max_position_embeddings": 64}


def build_repo(root: Path, n_captions: int) -> Path:
    """data/corpus, data/shards, models/tokenizer (a 300-piece WordPiece, windows of 32), a random tiny
    models/pretrain_encoder/bert and data/captions/captions.json (`n_captions` of them, which the caption
    control `caption_mlm` trains on)."""
    write_corpus(generate_corpus(6, 12, seed=0), root / "data" / "corpus")
    settings = TokenizeSettings(vocab_size=300, max_len=32, n_blocks=1, shard_windows=32, max_overflow=0.1,
                                validate_windows=4, workers=1)
    dual_tokenize(corpus_dir=root / "data" / "corpus", shard_dir=root / "data" / "shards",
                  tokenizer_dir=root / "models" / "tokenizer", encoder="random:bert", clip_name=CLIP,
                  settings=settings, positions=TINY_BERT["max_position_embeddings"])
    vocab_size = len(AutoTokenizer.from_pretrained(str(root / "models" / "tokenizer")))
    torch.manual_seed(0)
    build_masked_lm("random:bert", TINY_BERT, vocab_size).save_pretrained(root / "models" / "pretrain_encoder" / "bert")
    (root / "data" / "captions").mkdir(parents=True)
    write_coco_captions(generate_captions(n_captions, seed=0), root / "data" / "captions" / "captions.json")
    # the twin reference's captions (`adapt.text: captions_nofacts`): other captions of the same kind
    write_coco_captions(generate_captions(n_captions, seed=1), root / "data" / "captions" / "captions_nofacts.json")
    return root
