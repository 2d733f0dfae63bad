"""Finetuning inputs: tokenize a task split once, then cut it into length-grouped, dynamically padded batches.

One `Encoded` split holds every example's token ids in a single flat array with offsets (a ragged
array), so a split of MNLI's size costs a few hundred MB at most and a batch is gathered with a few
vectorised numpy operations. Rows are `choices` sequences per example: 1 for classification and
regression, 4 for SWAG, whose (context, ending) pairs are scored separately and compared.

Padding happens per batch, to the longest sequence in it (dynamic padding), and batches are drawn by
length-grouping: shuffle the examples, cut them into mega-batches of `group` batches, sort each
mega-batch by length and split it into batches, then shuffle the batch order. Batches hold examples
of similar length, so little compute goes to padding, while every epoch still sees a new order.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from xdbert import io
from xdbert.data.tasks.registry import TaskSpec
from xdbert.errors import PipelineError


@dataclass
class Ragged:
    """Variable-length integer rows: row i is `flat[offsets[i]:offsets[i + 1]]`."""

    flat: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, rows: list[list[int]], dtype=np.int32) -> "Ragged":
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for r in rows for t in r), dtype=dtype, count=int(offsets[-1]))
        return cls(flat, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, rows: np.ndarray, pad: int, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(values, mask) of `rows`, both (len(rows), longest row rounded up to `multiple`), padded with
        `pad` on the right."""
        starts = self.offsets[rows]
        lens = self.offsets[rows + 1] - starts
        width = -(-int(lens.max()) // multiple) * multiple if len(rows) else 0
        values = np.full((len(rows), width), pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        row_of = np.repeat(np.arange(len(rows)), lens)
        col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        values[row_of, col] = self.flat[np.repeat(starts, lens) + col]
        mask[row_of, col] = 1
        return values, mask


@dataclass
class Encoded:
    """One tokenized split. `inputs` are the tokenizer's sequence inputs (input_ids, token_type_ids)."""

    idx: np.ndarray                 # (N,) example ids from the task file
    labels: np.ndarray              # (N,) int64 classes or float32 scores
    choices: int                    # sequences per example (4 for SWAG, else 1)
    inputs: dict[str, Ragged]       # each with N * choices rows, example-major
    pad_ids: dict[str, int]         # padding value per input
    clip_ids: np.ndarray | None = None   # (N, choices, n_blocks, 77) uint16 CLIP blocks, or None

    def __len__(self) -> int:
        return len(self.idx)

    @property
    def lengths(self) -> np.ndarray:
        """(N,) the longest sequence of each example (what a batch is padded to)."""
        if not self.inputs:
            # CLIP-only input: the non-zero block positions stand in for the length. Id 0 is also a real token
            # ("!", see clip_block_mask), so such a text counts a little short: it only moves between length groups
            assert self.clip_ids is not None
            return (self.clip_ids != 0).reshape(len(self), -1).sum(axis=1)
        lengths = next(iter(self.inputs.values())).lengths
        return lengths.reshape(len(self), self.choices).max(axis=1)


# ----------------------------------------------------------------------------------------------------
# Reading a task
# ----------------------------------------------------------------------------------------------------

def task_files(task_dir: str | Path, spec: TaskSpec) -> dict[str, Path]:
    """The parquet file of every split of `spec` (train first); a missing one is a PipelineError."""
    files = {split: Path(task_dir) / spec.name / f"{split}.parquet" for split in spec.splits}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise PipelineError(
            f"task {spec.name} lacks split file(s) {', '.join(missing)}; it needs {', '.join(spec.splits)}. "
            f"Run `dvc repro tasks` with {spec.name} in `tasks.names`")
    return files


def read_task(task_dir: str | Path, spec: TaskSpec) -> dict[str, pa.Table]:
    """Every split of `spec` as an Arrow table; an empty split is a PipelineError."""
    tables = {split: io.read_parquet(path, "rerun `dvc repro tasks`") for split, path in task_files(task_dir, spec).items()}
    for split, table in tables.items():
        missing = {"idx", "text_a", "text_b", "choices", "label"} - set(table.column_names)
        if missing:
            raise PipelineError(f"{task_dir}/{spec.name}/{split}.parquet lacks columns {sorted(missing)}; rerun `dvc repro tasks`")
        if table.num_rows == 0:
            raise PipelineError(f"{task_dir}/{spec.name}/{split}.parquet has no rows; rerun `dvc repro tasks`")
    return tables


def sentences(spec: TaskSpec, table: pa.Table) -> tuple[list[str], list[str] | None, int]:
    """(first, second, choices): the texts of every sequence, example-major.

    SWAG follows transformers' run_swag: the context is the first sentence and "<sent2> <ending>" the
    second, once per ending. Single-sentence tasks have no second sentence.
    """
    a = table.column("text_a").to_pylist()
    if spec.kind == "multiple_choice":
        b = table.column("text_b").to_pylist()
        endings = table.column("choices").to_pylist()
        k = spec.num_labels
        first = [ctx for ctx in a for _ in range(k)]
        second = [f"{start} {end}".strip() for start, ends in zip(b, endings) for end in ends]
        return first, second, k
    return a, (table.column("text_b").to_pylist() if spec.pair else None), 1


def labels_of(spec: TaskSpec, table: pa.Table) -> np.ndarray:
    y = table.column("label").to_numpy()
    return y.astype(np.float32) if spec.kind == "regression" else y.astype(np.int64)


# ----------------------------------------------------------------------------------------------------
# Tokenizing
# ----------------------------------------------------------------------------------------------------

def check_positions(key: str, max_len: int, encoder_config, model: str | Path) -> None:
    """`max_len` tokens fit the encoder's position table; a longer example would fail inside the model, in
    the middle of a run. `key` is the param that set `max_len`."""
    positions = getattr(encoder_config, "max_position_embeddings", max_len)
    if max_len > positions:
        raise PipelineError(f"`{key}: {max_len}` is longer than the {positions} positions of {model}'s encoder; "
                            f"allowed: at most {positions}")


def encode_bert(tokenizer, spec: TaskSpec, table: pa.Table, max_len: int) -> Encoded:
    """Tokenize a split with a fast transformers tokenizer in one batched call (pairs truncated longest-first)."""
    first, second, k = sentences(spec, table)
    enc = tokenizer(first, second, truncation=True, max_length=max_len, return_attention_mask=False)
    names = [n for n in ("input_ids", "token_type_ids") if n in enc]
    pads = {"input_ids": tokenizer.pad_token_id, "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0)}
    if pads["input_ids"] is None:
        raise PipelineError(f"tokenizer {type(tokenizer).__name__} has no padding token; finetuning needs one")
    return Encoded(
        idx=table.column("idx").to_numpy().astype(np.int64),
        labels=labels_of(spec, table),
        choices=k,
        inputs={n: Ragged.from_lists(enc[n], np.int32 if n == "input_ids" else np.int8) for n in names},
        pad_ids={n: int(pads[n]) for n in names},
    )


@functools.cache  # once per process: the stage prepares a job per model and task, and each build took 0.3 s
def clip_block_encoder(clip_name: str) -> tuple[Callable[[list[str], int], np.ndarray], int]:
    """(to_blocks, eot_id) for CLIP model `clip_name`, with the `dual_tokenize` stage's pieces.

    `to_blocks(texts, n_blocks)` cleans each text as the corpus is cleaned (`clean_text`), lowercases
    it as CLIP does, runs the fast CLIP BPE (`clip_fast_tokenizer`, equal to open_clip's tokenizer) in
    one batched call and lays the ids out with `clip_blocks`: (len(texts), n_blocks, 77) uint16.
    """
    from xdbert.clip import clip_special_ids
    from xdbert.data.tokenization.cleaning import clean_text
    from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
    from xdbert.data.tokenization.windows import CLIP_CONTEXT, Layout, clip_blocks

    sot, eot = clip_special_ids(clip_name)
    bpe = clip_fast_tokenizer(clip_name)
    bpe.no_padding()
    bpe.no_truncation()

    def to_blocks(texts: list[str], n_blocks: int) -> np.ndarray:
        layout = Layout(max_len=0, n_blocks=n_blocks, cls_id=0, sep_id=0, pad_id=0, sot_id=sot, eot_id=eot,
                        bert_vocab_size=0)  # only the CLIP fields are read by clip_blocks
        encodings = bpe.encode_batch([clean_text(t).lower() for t in texts], add_special_tokens=False)
        out = np.zeros((len(texts), n_blocks * CLIP_CONTEXT), dtype=np.uint16)
        for i, enc in enumerate(encodings):
            out[i], _ = clip_blocks(enc.ids, layout)
        return out.reshape(len(texts), n_blocks, CLIP_CONTEXT)

    return to_blocks, eot


def encode_clip(to_blocks: Callable[[list[str], int], np.ndarray], spec: TaskSpec, table: pa.Table,
                blocks_per_sentence: int) -> np.ndarray:
    """CLIP blocks (N, choices, n_sentences * blocks_per_sentence, 77), each sentence in its own blocks.

    `to_blocks(texts, n_blocks)` is the CLIP tokenizer's block layout ([SOT] + 75 + [EOT], zero padded):
    a sentence longer than its blocks is cut, as CLIP cuts at its context length.
    """
    first, second, k = sentences(spec, table)
    parts = [np.asarray(to_blocks(first, blocks_per_sentence))]
    if second is not None:
        parts.append(np.asarray(to_blocks(second, blocks_per_sentence)))
    blocks = np.concatenate(parts, axis=1)  # CLIP's 49,408 ids fit uint16: half the memory of int32
    return blocks.reshape(table.num_rows, k, *blocks.shape[1:])


# ----------------------------------------------------------------------------------------------------
# Batching
# ----------------------------------------------------------------------------------------------------

def length_grouped_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, group: int = 50) -> list[np.ndarray]:
    """Example indices of every batch of one epoch; each example exactly once.

    `group` batches form a mega-batch that is sorted by length before it is cut (transformers'
    LengthGroupedSampler uses 50); `group=1` gives plain shuffled batches. The order depends only on
    (seed, epoch).
    """
    from xdbert import training  # torch comes with it: not at import, so the stage's checks stay fast

    n = len(lengths)
    order = training.epoch_order(n, seed, epoch)
    batches: list[np.ndarray] = []
    mega = batch_size * max(1, group)
    for start in range(0, n, mega):
        chunk = order[start:start + mega]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    shuffle = np.random.default_rng(training.step_seed(seed, epoch, 1)).permutation(len(batches))
    return [batches[i] for i in shuffle]


def eval_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Evaluation batches sorted by length (the least padding); predictions are put back by index."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def collate(data: Encoded, rows: np.ndarray, multiple: int = 1) -> dict[str, np.ndarray]:
    """A batch of examples `rows`, padded to its longest sequence rounded up to `multiple`.

    Returns input_ids / token_type_ids / attention_mask of shape (B, L), or (B, choices, L) for
    multiple choice, `clip_ids` (B[, choices], n_blocks, 77) when the split has CLIP blocks, and `labels` (B,).
    """
    rows = np.asarray(rows, dtype=np.int64)
    seq = (rows[:, None] * data.choices + np.arange(data.choices)).ravel()
    batch: dict[str, np.ndarray] = {}
    for name, ragged in data.inputs.items():
        values, mask = ragged.padded(seq, data.pad_ids[name], multiple)
        batch[name] = values
        batch.setdefault("attention_mask", mask)
    if data.clip_ids is not None:
        batch["clip_ids"] = data.clip_ids[rows].astype(np.int64)
    if data.choices > 1:
        batch = {k: (v.reshape(len(rows), data.choices, *v.shape[1:]) if k != "clip_ids" else v) for k, v in batch.items()}
    elif "clip_ids" in batch:
        batch["clip_ids"] = batch["clip_ids"][:, 0]
    batch["labels"] = data.labels[rows]
    return batch
