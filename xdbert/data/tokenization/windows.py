"""The row layout of a window: BERT tokens, CLIP blocks and the alignment between them.

* **Windows**. A document is BERT-tokenized once with offsets and cut into windows of at most
  `max_len - 2` tokens, only at word starts (never between a word's pieces), so the window text,
  `doc[start of the first token : end of the last token]`, re-tokenizes to the same ids. A row is
  [CLS] tokens [SEP] padded with [PAD]. A word longer than a whole window is skipped and counted.
* **CLIP blocks**. The window text's CLIP content tokens fill `n_blocks` blocks of 75: each used
  block is [SOT] content [EOT] then zeros up to 77; an unused block is all zeros. Id 0 is a real
  token ("!"), so validity comes from the [EOT] position (`xdbert.clip.clip_block_mask`), never from
  `id == 0`. Content beyond n_blocks x 75 tokens is cut and the window counted as overflow.
* **Alignment**. For BERT position p, `[align_start, align_end)` is the flat CLIP position range
  (flat = block * 77 + position in block) of the CLIP tokens whose character spans overlap the BERT
  token's span; -1/-1 for [CLS], [SEP], padding and tokens whose CLIP tokens were all cut off.
  Both tokenizations are monotone in the text, so each range is contiguous (a range that crosses a
  block boundary also covers that boundary's [EOT] and [SOT]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from xdbert.data import shards

CLIP_CONTEXT = 77  # CLIP-T's context: [SOT] + 75 content tokens + [EOT]
CLIP_CONTENT = CLIP_CONTEXT - 2


@dataclass(frozen=True)
class Layout:
    """Sizes and special ids of one shard set."""

    max_len: int
    n_blocks: int
    cls_id: int
    sep_id: int
    pad_id: int
    sot_id: int
    eot_id: int
    bert_vocab_size: int

    @property
    def capacity(self) -> int:
        """BERT tokens per window without [CLS] and [SEP]."""
        return self.max_len - 2

    @property
    def clip_width(self) -> int:
        return self.n_blocks * CLIP_CONTEXT

    @property
    def clip_capacity(self) -> int:
        return self.n_blocks * CLIP_CONTENT

    @property
    def bert_dtype(self) -> np.dtype:
        return shards.bert_dtype(self.bert_vocab_size)


def flat_clip_position(i: np.ndarray) -> np.ndarray:
    """Flat position (block * 77 + position in block) of content token i (0-based) of a window."""
    i = np.asarray(i)
    return (i // CLIP_CONTENT) * CLIP_CONTEXT + 1 + i % CLIP_CONTENT


def clip_blocks(content: Sequence[int] | np.ndarray, layout: Layout) -> tuple[np.ndarray, int]:
    """Lay content ids into n_blocks blocks of [SOT] <=75 tokens [EOT], zero-padded to 77 each.

    Returns (row of n_blocks*77 uint16, number of content tokens kept); the rest is overflow.
    """
    content = np.asarray(content, dtype=np.int64)
    kept = min(len(content), layout.clip_capacity)
    row = np.zeros(layout.clip_width, dtype=np.uint16)
    row[flat_clip_position(np.arange(kept))] = content[:kept]
    used = -(-kept // CLIP_CONTENT)
    starts = np.arange(used) * CLIP_CONTEXT
    row[starts] = layout.sot_id
    per_block = np.minimum(CLIP_CONTENT, kept - np.arange(used) * CLIP_CONTENT)
    row[starts + 1 + per_block] = layout.eot_id
    return row, kept


def clip_content(row: np.ndarray, eot_id: int) -> list[int]:
    """The content ids of one window's CLIP blocks, in order, without [SOT]/[EOT]/padding (the cleaned text
    has no `<end_of_text>`, so content never holds an [EOT])."""
    import torch  # here, not at the top: only the checks read a row back, and the rest of this module is numpy

    from xdbert.clip import clip_block_mask

    blocks = np.asarray(row, dtype=np.int64).reshape(-1, CLIP_CONTEXT)
    mask = clip_block_mask(torch.from_numpy(blocks), eot_id).numpy()
    out: list[int] = []
    for b in range(blocks.shape[0]):
        n = int(mask[b].sum())
        if n:
            out.extend(int(x) for x in blocks[b, 1:n - 1])
    return out


@dataclass
class Windows:
    """The windows of a run of documents, as row arrays plus what validation and statistics need."""

    bert_ids: np.ndarray      # (n, max_len)
    bert_len: np.ndarray      # (n,) int16, with [CLS]/[SEP]
    clip_ids: np.ndarray      # (n, n_blocks*77) uint16
    align_start: np.ndarray   # (n, max_len) int16
    align_end: np.ndarray     # (n, max_len) int16
    doc_index: np.ndarray     # (n,) int32
    char_span: np.ndarray     # (n, 2) int64: the window text in the cleaned document
    clip_tokens: np.ndarray   # (n,) int32: CLIP content tokens before the cut
    docs: int = 0
    dropped_words: int = 0
    unaligned: int = 0
    unaligned_example: str | None = None

    def __len__(self) -> int:
        return len(self.bert_len)

    @property
    def overflow(self) -> np.ndarray:
        return self.clip_tokens > (self.clip_ids.shape[1] // CLIP_CONTEXT) * CLIP_CONTENT

    def rows(self) -> dict[str, np.ndarray]:
        """The six shard columns (`shards.COLUMNS`)."""
        return {k: getattr(self, k) for k in shards.COLUMNS}


def concat_windows(parts: Sequence[Windows]) -> Windows:
    """One `Windows` from several (in order); the counters are summed."""
    arrays = {k: np.concatenate([getattr(p, k) for p in parts]) for k in
              ("bert_ids", "bert_len", "clip_ids", "align_start", "align_end", "doc_index", "char_span", "clip_tokens")}
    examples = [p.unaligned_example for p in parts if p.unaligned_example]
    return Windows(**arrays, docs=sum(p.docs for p in parts), dropped_words=sum(p.dropped_words for p in parts),
                   unaligned=sum(p.unaligned for p in parts), unaligned_example=examples[0] if examples else None)


def alignment_problem(start: np.ndarray, end: np.ndarray, bert_len: int, truncated: bool, layout: Layout) -> str | None:
    """What is wrong with one window's alignment, or None: specials and padding -1, ranges inside the
    CLIP row, monotone, non-empty for every token (with a CLIP cut: all but a final run of -1)."""
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    inner = slice(1, bert_len - 1)
    if (start[[0, *range(bert_len - 1, len(start))]] != -1).any() or (end[[0, *range(bert_len - 1, len(end))]] != -1).any():
        return "is not -1 at [CLS], [SEP] or padding"
    s, e = start[inner], end[inner]
    has = s >= 0
    if ((e >= 0) != has).any() or (has & (e <= s)).any():
        return "has an empty or half-set range"
    if has.any() and (s[has].min() < 1 or e[has].max() > layout.clip_width):
        return "points outside the CLIP blocks"
    if (np.diff(s[has]) < 0).any() or (np.diff(e[has]) < 0).any():
        return "is not monotone"
    if not has.all():
        first_missing = int(np.argmin(has))
        if not truncated or has[first_missing:].any():
            return "leaves a token without CLIP tokens whose text was not cut off"
    return None
