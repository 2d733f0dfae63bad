"""Dual tokenization over a process pool, chunk by chunk in document order.

What the pool pickles lives here at module level (`_init_worker`, `_encode_chunk`) or in `cleaning`
(`clean_text`), so a worker finds it by name; the chunks are cut and returned in document order, so
any number of workers writes the same shards.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from typing import Iterator, Sequence

from xdbert.data.tokenization.cleaning import clean_text, ftfy_unsafe_characters
from xdbert.data.tokenization.dual import DualTokenizer
from xdbert.data.tokenization.windows import Layout, Windows

CHUNK_CHARS = 1 << 17  # text per pool task: small enough to balance 2 workers on the embedded corpus
_WORKER: DualTokenizer | None = None  # this process's tokenizer when it is a pool worker


def _init_worker(bert_json: str, clip_json: str, layout: Layout) -> None:
    global _WORKER
    _WORKER = DualTokenizer(bert_json, clip_json, layout)


def _encode_chunk(task: tuple[int, list[str], bool]) -> Windows:
    first, docs, clean = task
    assert _WORKER is not None
    return _WORKER.encode(docs, first, clean)


def _chunks(docs: Sequence[str], clean: bool) -> Iterator[tuple[int, list[str], bool]]:
    start, size = 0, 0
    for i, d in enumerate(docs):
        size += len(d)
        if size >= CHUNK_CHARS:
            yield start, list(docs[start:i + 1]), clean
            start, size = i + 1, 0
    if start < len(docs):
        yield start, list(docs[start:]), clean


def _pool(workers: int, initializer=None, initargs=()):
    # fork: workers inherit the loaded libraries and a ready DualTokenizer. One Rust thread each: the
    # pool is the parallelism (open_clip sets TOKENIZERS_PARALLELISM=false anyway).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    ftfy_unsafe_characters()  # computed once here, inherited by the workers
    if "fork" in mp.get_all_start_methods():
        return mp.get_context("fork").Pool(workers)
    return mp.get_context("spawn").Pool(workers, initializer, initargs)


class DualPool:
    """Dual tokenization over `workers` processes (in this process when workers is 1).

    `windows(docs)` yields `Windows` chunk by chunk in document order. Use as a context manager; the
    workers are stopped on exit, also when the consumer fails half-way.
    """

    def __init__(self, bert_json: str, clip_json: str, layout: Layout, workers: int = 1):
        global _WORKER
        self.dual = DualTokenizer(bert_json, clip_json, layout)
        self.pool = None
        if workers > 1:
            _WORKER = self.dual  # what a forked worker encodes with
            self.pool = _pool(workers, _init_worker, (bert_json, clip_json, layout))

    def windows(self, docs: Sequence[str], clean: bool = True) -> Iterator[Windows]:
        tasks = _chunks(docs, clean)
        if self.pool is None:
            for first, chunk, cl in tasks:
                yield self.dual.encode(chunk, first, cl)
        else:
            yield from self.pool.imap(_encode_chunk, tasks)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def __enter__(self) -> "DualPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tokenize_docs(docs: Sequence[str], bert_json: str, clip_json: str, layout: Layout,
                  workers: int = 1, clean: bool = True) -> Iterator[Windows]:
    """Windows of `docs`, chunk by chunk in document order, over `workers` processes."""
    with DualPool(bert_json, clip_json, layout, workers) as pool:
        yield from pool.windows(docs, clean)


def clean_docs(docs: Sequence[str], workers: int = 1) -> list[str]:
    """`clean_text` over all documents, over `workers` processes."""
    if workers <= 1 or len(docs) < 2:
        return [clean_text(d) for d in docs]
    with _pool(workers) as pool:
        return pool.map(clean_text, docs, chunksize=max(1, len(docs) // (8 * workers)))
