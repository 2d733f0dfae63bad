"""Tiny finetuning tasks where one keyword decides the label, a tiny random BERT, and the embedded
profile's `finetune` settings at their sizes: what the finetuning tests train."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from xdbert.data.tasks.registry import TaskSpec, get_task, to_table
from xdbert.finetuning.control.settings import FinetuneSettings
from xdbert.profiles import values

FILLER = "the a of to in on at with from river stone cloud table green small quiet early north paper".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(FILLER) for _ in range(n)]


def _sentence(rng: random.Random, keyword: str | None, lo: int = 2, hi: int = 9) -> str:
    words = _words(rng, rng.randint(lo, hi))
    if keyword:
        words.insert(rng.randint(0, len(words)), keyword)
    return " ".join(words)


def keyword_rows(task: str, n: int, seed: int) -> dict[str, list]:
    """sst2: `good`/`bad` decides; stsb: the number of `up` in the second sentence is the score;
    swag: the ending with `yes` is right; mnli: `yes`/`maybe`/`no` in the hypothesis."""
    rng = random.Random(f"{task}:{seed}")
    rows = {"idx": list(range(n)), "text_a": [], "text_b": [], "choices": [], "label": []}
    for i in range(n):
        if task == "sst2":
            y = i % 2
            rows["text_a"].append(_sentence(rng, "good" if y else "bad"))
            rows["text_b"].append(None), rows["choices"].append(None), rows["label"].append(y)
        elif task == "stsb":
            y = i % 4
            b = _words(rng, rng.randint(2, 6)) + ["up"] * y
            rng.shuffle(b)
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append(" ".join(b))
            rows["choices"].append(None), rows["label"].append(float(y))
        elif task == "mnli":
            y = i % 3
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append(_sentence(rng, ("yes", "maybe", "no")[y]))
            rows["choices"].append(None), rows["label"].append(y)
        elif task == "swag":
            y = i % 4
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append("then")
            rows["choices"].append([_sentence(rng, "yes" if j == y else None, 1, 4) for j in range(4)])
            rows["label"].append(y)
    return rows


def keyword_tables(task: str, n_train: int = 160, n_dev: int = 64) -> dict:
    spec = get_task(task)
    return {split: to_table(spec, keyword_rows(task, n_train if split == "train" else n_dev, k))
            for k, split in enumerate(spec.splits)}


def save_tiny_bert(directory: Path, layers: int = 2, hidden: int = 32) -> Path:
    """A random BERT and a word-level WordPiece vocabulary over the test words, as save_pretrained writes them."""
    from transformers import BertConfig, BertModel, BertTokenizer

    words = SPECIALS + sorted(set(FILLER) | {"good", "bad", "up", "yes", "no", "maybe", "then"})
    # built like xdbert.data.tokenization.vocab.train_wordpiece builds the pipeline's tokenizer
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True, model_max_length=64)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(words), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=64)
    BertModel(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def settings(spec: TaskSpec, lr: float = 3e-3, **changes) -> FinetuneSettings:
    """The embedded profile's `finetune` settings for `spec` at test sizes, with rate `lr` for every model size."""
    sizes = dict(epochs=6, batch_size=16, max_len=32, warmup_ratio=0.1, length_group=4)
    embedded = FinetuneSettings.from_params(values("embedded"), spec)
    return dataclasses.replace(embedded, lr={spec.name: {"base": lr, "large": lr}}, **{**sizes, **changes})
