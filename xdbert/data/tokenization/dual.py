"""Documents to aligned BERT windows and CLIP blocks, in one process (`DualTokenizer`).

Text is tokenized piece by piece (`PieceMemo`) by the Rust tokenizers; windows, blocks and the
alignment (see `windows`) are numpy over a whole chunk of documents at once.
"""
from __future__ import annotations

import json
from itertools import chain
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from xdbert.data.tokenization.cleaning import clean_text
from xdbert.data.tokenization.windows import CLIP_CONTENT, CLIP_CONTEXT, Layout, Windows, flat_clip_position

PIECE_MEMO_SIZE = 1 << 19  # memoized pieces per tokenizer and process; the memo is emptied when full


class PieceMemo:
    """A tokenizer's output on space-free pieces of text, memoized.

    Why this is exact: the cleaned text's only whitespace is single spaces, and both tokenizers are
    context-free across a space. BERT's normalizer works character by character and its
    pre-tokenizer splits at whitespace; CLIP lowercases (str.lower's one context rule, the final
    sigma, stops at a space as well) and its split pattern never matches a space. So the tokens of
    "a b" are the tokens of "a" then those of "b", and a text can be tokenized piece by piece. Words
    repeat (Zipf), so most pieces are found in the memo and the Rust tokenizer sees each new piece
    once, all new pieces of a chunk in one call.

    Storage: the tokens of all known pieces in growing arrays (`ids`, `offsets` within the piece);
    `table[piece] = (first token, number of tokens)`.
    """

    def __init__(self, tokenizer: Tokenizer, lower: bool = False):
        self.tokenizer, self.lower = tokenizer, lower
        self._reset()

    def _reset(self) -> None:
        self.table: dict[str, tuple[int, int]] = {}
        self.size = 0
        self.ids = np.zeros(1 << 16, dtype=np.int64)
        self.offsets = np.zeros((1 << 16, 2), dtype=np.int64)

    def _fill(self, missing: list[str]) -> None:
        # All new pieces in one call, joined by spaces (exact, see above): one Encoding to convert.
        texts = [p.lower() for p in missing] if self.lower else missing
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        bases = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        enc = self.tokenizer.encode(" ".join(texts), add_special_tokens=False)
        n = len(enc.ids)
        offsets = np.fromiter(chain.from_iterable(enc.offsets), dtype=np.int64, count=2 * n).reshape(n, 2)
        cuts = np.append(np.searchsorted(offsets[:, 0], bases), n)
        counts = np.diff(cuts)
        offsets -= np.repeat(bases, counts)[:, None]  # within each piece
        for k in np.flatnonzero(lengths != np.fromiter(map(len, missing), dtype=np.int64, count=len(missing))):
            # lowercasing changed a length ('İ' -> 'i̇'): offsets into the piece itself
            offsets[cuts[k]:cuts[k + 1]] = _unlower_offsets(missing[k], offsets[cuts[k]:cuts[k + 1]])
        while self.size + n > len(self.ids):
            self.ids = np.concatenate([self.ids, np.zeros_like(self.ids)])
            self.offsets = np.concatenate([self.offsets, np.zeros_like(self.offsets)])
        self.ids[self.size:self.size + n] = enc.ids
        self.offsets[self.size:self.size + n] = offsets
        self.table.update(zip(missing, zip((cuts[:-1] + self.size).tolist(), counts.tolist())))
        self.size += n

    def tokens(self, unique: list[str], inverse: np.ndarray, piece_start: np.ndarray):
        """Tokens of consecutive pieces, given as `unique[inverse]` (see `_unique`): ids, starts, ends
        (offsets within the piece shifted by `piece_start`) and the number of tokens of each piece."""
        missing = [p for p in unique if p not in self.table]
        if len(self.table) + len(missing) > PIECE_MEMO_SIZE:
            self._reset()
            missing = unique
        if missing:
            self._fill(missing)
        spans = np.fromiter(chain.from_iterable(map(self.table.__getitem__, unique)), dtype=np.int64,
                            count=2 * len(unique)).reshape(-1, 2)
        first, counts = spans[inverse, 0], spans[inverse, 1]
        index = _ranges_to_index(first, first + counts)
        shift = np.repeat(np.asarray(piece_start, dtype=np.int64), counts)
        return self.ids[index], self.offsets[index, 0] + shift, self.offsets[index, 1] + shift, counts


def _unique(pieces: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct pieces in first-seen order, and each piece's index among them."""
    position = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    return list(position), np.fromiter(map(position.__getitem__, pieces), dtype=np.int64, count=len(pieces))


def _ranges_to_index(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """np.concatenate([np.arange(l, h) for l, h in zip(lo, hi)]) without the Python loop."""
    lengths = np.asarray(hi, dtype=np.int64) - lo
    before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) - np.repeat(before, lengths) + np.repeat(lo, lengths)


class DualTokenizer:
    """Cleans documents and turns them into aligned BERT windows and CLIP blocks (one process).

    Text is tokenized piece by piece (see `PieceMemo`) by the Rust tokenizers; windows, blocks and
    the alignment are numpy over a whole chunk of documents at once.
    """

    def __init__(self, bert_json: str, clip_json: str, layout: Layout):
        self.layout = layout
        self.bert = Tokenizer.from_str(bert_json)
        self.clip = Tokenizer.from_str(clip_json)
        for tok in (self.bert, self.clip):
            tok.no_padding()
            tok.no_truncation()
        spec = json.loads(bert_json)
        model, pre, norm = (spec.get(k) or {} for k in ("model", "pre_tokenizer", "normalizer"))
        # BERT's own pipeline (bert-base-uncased, ELECTRA, the trained vocabulary) is context-free
        # across spaces; any other tokenizer is run on whole documents.
        self.bert_is_bert = (model.get("type") == "WordPiece" and pre.get("type") == "BertPreTokenizer"
                             and norm.get("type") in ("BertNormalizer", None)
                             and not any(" " in t["content"] for t in spec.get("added_tokens") or []))
        self.bert_memo = PieceMemo(self.bert) if self.bert_is_bert else None
        self.clip_memo = PieceMemo(self.clip, lower=True)
        # With BERT's WordPiece a token starts a word unless it is a "##" piece: a lookup table.
        self.continuation = None
        if self.bert_is_bert:
            prefix = model.get("continuing_subword_prefix", "##")
            vocab = self.bert.get_vocab(with_added_tokens=True)
            self.continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
            self.continuation[[i for t, i in vocab.items() if t.startswith(prefix)]] = True

    def cut(self, word_start: np.ndarray) -> tuple[list[tuple[int, int]], int]:
        """Token ranges [s, e) of the windows of one document, cut only at word starts.

        Greedy: each window takes as many whole words as fit. A word with more pieces than a window
        holds cannot be kept whole; it is skipped and counted (second value).
        """
        n = len(word_start)
        cap = self.layout.capacity
        if n <= cap:
            return [(0, n)], 0
        bounds = np.append(np.flatnonzero(word_start), n)
        windows, dropped, s = [], 0, 0
        while s < n:
            if s + cap >= n:
                windows.append((s, n))
                break
            e = int(bounds[np.searchsorted(bounds, s + cap, side="right") - 1])
            if e <= s:  # the word starting at s is longer than a window
                dropped += 1
                s = int(bounds[np.searchsorted(bounds, s, side="right")])
                continue
            windows.append((s, e))
            s = e
        return windows, dropped

    def _bert_tokens(self, texts: list[str], unique: list[str], inverse: np.ndarray, piece_start: np.ndarray,
                     doc_pieces: np.ndarray):
        """All BERT tokens of the chunk: ids, (start, end) offsets within their document, word starts,
        and the first token of each document (len(texts) + 1 values)."""
        if self.bert_memo is not None:
            ids, starts, ends, counts = self.bert_memo.tokens(unique, inverse, piece_start)
            per_doc = np.add.reduceat(counts, doc_pieces[:-1]) if len(counts) else np.zeros(len(texts), np.int64)
            word_start = ~self.continuation[ids]
        else:
            encodings = self.bert.encode_batch(texts, add_special_tokens=False)
            per_doc = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
            total = int(per_doc.sum())
            ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int64, count=total)
            offsets = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)),
                                  dtype=np.int64, count=2 * total).reshape(total, 2)
            starts, ends = offsets[:, 0], offsets[:, 1]
            words = np.fromiter((-1 if w is None else w for e in encodings for w in e.word_ids), dtype=np.int64, count=total)
            word_start = np.r_[True, words[1:] != words[:-1]] if total else np.zeros(0, bool)
            word_start[np.concatenate([[0], np.cumsum(per_doc)[:-1]])[per_doc > 0]] = True
        return ids, np.stack([starts, ends], axis=1), word_start, np.concatenate([[0], np.cumsum(per_doc)])

    def _clip_tokens(self, texts, unique, inverse, piece_start, piece_end, piece_doc, win_doc, span):
        """CLIP tokens of every window: ids, window-relative offsets, and tokens per window.

        A window covers whole pieces, except where it starts or ends inside one (a cut such as
        "don' | t"): such a partial piece is tokenized on its own, as the reference does with the
        window text. Each window is a list of segments, token ranges [lo, hi) in the pieces'
        tokens followed by the partial pieces' tokens.
        """
        big = np.int64(1 << 40)
        p_ids, p_start, p_end, p_count = self.clip_memo.tokens(unique, inverse, piece_start)
        p_first = np.concatenate([[0], np.cumsum(p_count)])
        key = piece_doc * big + piece_start
        a, b = span[:, 0], span[:, 1]
        first = np.searchsorted(key, win_doc * big + a, side="right") - 1  # piece holding the first character
        last = np.searchsorted(key, win_doc * big + b - 1, side="right") - 1  # ... and the last one
        whole = (a == piece_start[first]) & (b == piece_end[last])

        # Windows of whole pieces (nearly all): one range each.
        seg_window = np.flatnonzero(whole).tolist()
        seg_lo = p_first[first[whole]].tolist()
        seg_hi = p_first[last[whole] + 1].tolist()
        # Windows with a cut piece: up to three segments; a partial piece's range is set once its
        # tokens are known (its number among the partial texts is kept meanwhile, as -1 - number).
        parts, part_base = [], []

        def add_part(w: int, x: int, y: int) -> None:
            seg_window.append(w), seg_lo.append(-1 - len(parts)), seg_hi.append(0)
            parts.append(texts[win_doc[w]][x:y]), part_base.append(x)

        for w in np.flatnonzero(~whole).tolist():
            f, g = int(first[w]), int(last[w])
            if f == g:
                add_part(w, a[w], b[w])
                continue
            if a[w] == piece_start[f]:
                seg_window.append(w), seg_lo.append(p_first[f]), seg_hi.append(p_first[f + 1])
            else:
                add_part(w, a[w], piece_end[f])
            seg_window.append(w), seg_lo.append(p_first[f + 1]), seg_hi.append(p_first[g])
            if b[w] == piece_end[g]:
                seg_window.append(w), seg_lo.append(p_first[g]), seg_hi.append(p_first[g + 1])
            else:
                add_part(w, piece_start[g], b[w])
        q_ids, q_start, q_end, q_count = self.clip_memo.tokens(*_unique(parts), np.asarray(part_base, np.int64))
        q_first = np.concatenate([[0], np.cumsum(q_count)]) + len(p_ids)

        seg_window, seg_lo, seg_hi = (np.asarray(x, dtype=np.int64) for x in (seg_window, seg_lo, seg_hi))
        part = seg_lo < 0
        number = -1 - seg_lo[part]
        seg_lo[part], seg_hi[part] = q_first[number], q_first[number + 1]
        order = np.argsort(seg_window, kind="stable")  # window by window, segments in text order
        seg_window, seg_lo, seg_hi = seg_window[order], seg_lo[order], seg_hi[order]
        index = _ranges_to_index(seg_lo, seg_hi)
        m = np.bincount(seg_window, weights=seg_hi - seg_lo, minlength=len(win_doc)).astype(np.int64)
        shift = np.repeat(a, m)
        starts = np.concatenate([p_start, q_start])[index] - shift
        ends = np.concatenate([p_end, q_end])[index] - shift
        return np.concatenate([p_ids, q_ids])[index], np.stack([starts, ends], axis=1), m

    def encode(self, docs: Sequence[str], first_doc: int = 0, clean: bool = True) -> Windows:
        """Windows of `docs` (cleaned here unless `clean=False`); doc_index counts from `first_doc`."""
        lay = self.layout
        texts = [clean_text(d) if clean else d for d in docs]
        # The chunk as space-free pieces (see PieceMemo), each with its document and start in it.
        split = [t.split(" ") for t in texts]
        pieces = list(chain.from_iterable(split))
        unique, inverse = _unique(pieces)
        n_pieces = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
        doc_pieces = np.concatenate([[0], np.cumsum(n_pieces)])
        piece_doc = np.repeat(np.arange(len(texts)), n_pieces)
        piece_len = np.fromiter(map(len, unique), dtype=np.int64, count=len(unique))[inverse]
        at = np.concatenate([[0], np.cumsum(piece_len + 1)[:-1]])
        piece_start = at - at[doc_pieces[:-1]][piece_doc]  # within its document

        ids, offsets, word_start, first = self._bert_tokens(texts, unique, inverse, piece_start, doc_pieces)
        win_doc, win_s, win_e, dropped = [], [], [], 0
        for d in np.flatnonzero(np.diff(first)).tolist():
            cuts, lost = self.cut(word_start[first[d]:first[d + 1]])
            dropped += lost
            for s, e in cuts:
                win_doc.append(d)
                win_s.append(first[d] + s)
                win_e.append(first[d] + e)
        n = len(win_doc)
        win_doc, win_s, win_e = (np.asarray(x, dtype=np.int64) for x in (win_doc, win_s, win_e))
        char_span = np.stack([offsets[win_s, 0], offsets[win_e - 1, 1]], axis=1) if n else np.zeros((0, 2), np.int64)

        out = Windows(
            bert_ids=np.full((n, lay.max_len), lay.pad_id, dtype=lay.bert_dtype),
            bert_len=(win_e - win_s + 2).astype(np.int16),
            clip_ids=np.zeros((n, lay.clip_width), dtype=np.uint16),
            align_start=np.full((n, lay.max_len), -1, dtype=np.int16),
            align_end=np.full((n, lay.max_len), -1, dtype=np.int16),
            doc_index=(win_doc + first_doc).astype(np.int32),
            char_span=char_span,
            clip_tokens=np.zeros(n, dtype=np.int32),
            docs=len(docs),
            dropped_words=dropped,
        )
        if n == 0:
            return out

        # BERT rows: [CLS] tokens [SEP] [PAD]...; (window, position) grids over the window's tokens.
        lengths = win_e - win_s
        pos = np.arange(lay.capacity)
        real = pos < lengths[:, None]
        token = np.where(real, win_s[:, None] + pos, 0)  # index into the chunk's tokens
        out.bert_ids[:, 0] = lay.cls_id
        out.bert_ids[:, 1:lay.capacity + 1] = np.where(real, ids[token], lay.pad_id)
        out.bert_ids[np.arange(n), lengths + 1] = lay.sep_id

        # CLIP tokens of each window text, offsets relative to the window.
        c_ids, c_off, m = self._clip_tokens(texts, unique, inverse, piece_start, piece_start + piece_len, piece_doc,
                                            win_doc, char_span)
        out.clip_tokens[:] = m
        c_first = np.concatenate([[0], np.cumsum(m)])

        # Blocks: content token i of a window goes to flat position (i // 75) * 77 + 1 + i % 75.
        kept = np.minimum(m, lay.clip_capacity)
        c_win = np.repeat(np.arange(n), m)
        c_pos = np.arange(len(c_ids)) - c_first[c_win]
        keep = c_pos < kept[c_win]
        out.clip_ids[c_win[keep], flat_clip_position(c_pos[keep])] = c_ids[keep]
        used = -(-kept // CLIP_CONTENT)
        b_win = np.repeat(np.arange(n), used)
        b_idx = np.arange(int(used.sum())) - np.repeat(np.cumsum(used) - used, used)
        out.clip_ids[b_win, b_idx * CLIP_CONTEXT] = lay.sot_id
        per_block = np.minimum(CLIP_CONTENT, kept[b_win] - b_idx * CLIP_CONTENT)
        out.clip_ids[b_win, b_idx * CLIP_CONTEXT + 1 + per_block] = lay.eot_id

        # Alignment: one searchsorted for the whole chunk, with each window's character offsets
        # lifted by window * BIG so windows never mix.
        big = np.int64(1 << 40)
        k_start = c_off[keep, 0] + c_win[keep] * big
        k_end = c_off[keep, 1] + c_win[keep] * big
        k_first = np.cumsum(kept) - kept  # first kept CLIP token of each window, in the kept arrays
        lift = (np.arange(n) * big - char_span[:, 0])[:, None]  # window-relative offsets, lifted
        b_start, b_end = offsets[token, 0] + lift, offsets[token, 1] + lift
        lo = np.searchsorted(k_end, b_start, side="right")
        hi = np.searchsorted(k_start, b_end, side="left")
        ok = real & (lo < hi)
        rel_lo, rel_hi = lo - k_first[:, None], hi - 1 - k_first[:, None]
        out.align_start[:, 1:lay.capacity + 1] = np.where(ok, flat_clip_position(np.maximum(rel_lo, 0)), -1)
        out.align_end[:, 1:lay.capacity + 1] = np.where(ok, flat_clip_position(np.maximum(rel_hi, 0)) + 1, -1)

        # Every token whose text was not cut off the CLIP side must have CLIP tokens: with a cut, the
        # tokens starting before the end of the last kept CLIP token; without one, all tokens.
        cut_at = np.arange(n) * big  # (lifted) window start: a window without kept CLIP tokens
        has = kept > 0
        cut_at[has] = k_end[(k_first + kept - 1)[has]]
        lost = real & ~ok & ((kept == m)[:, None] | (b_start < cut_at[:, None]))
        if lost.any():
            out.unaligned = int(lost.sum())
            w, j = (int(x[0]) for x in np.nonzero(lost))
            text = texts[win_doc[w]][char_span[w, 0]:char_span[w, 1]]
            x, y = (int(v) for v in offsets[token[w, j]] - char_span[w, 0])
            out.unaligned_example = f"{text[x:y]!r} in {text!r}"
        return out


def _unlower_offsets(text: str, offsets: np.ndarray) -> np.ndarray:
    """Map offsets in `text.lower()` back to `text` when lowercasing changed lengths (e.g. 'İ' -> 'i̇')."""
    lengths = [len(c.lower()) for c in text]  # str.lower's only context rule (final sigma) keeps lengths
    source = np.repeat(np.arange(len(text)), lengths)
    return np.stack([source[offsets[:, 0]], source[offsets[:, 1] - 1] + 1], axis=1)
