"""Dual tokenization: the corpus as BERT WordPiece windows and the same text as CLIP BPE blocks.

One text, two tokenizers, aligned by character spans:

* **Cleaning** (`clean_text`). Every document is cleaned once, with CLIP's own cleaning: open_clip's
  `basic_clean` (ftfy.fix_text, html.unescape twice, strip) and `whitespace_clean` (runs of
  whitespace become one space), plus the removal of CLIP's special-token strings (`<start_of_text>`,
  `<end_of_text>`, in any case) so a real end token never appears inside the content. The rule is
  repeated while the unescaping or the removal still changes the text (one pass for real text).
  Both tokenizers read this cleaned text, so CLIP's reference tokenizer, which cleans its input
  itself, gets back the very same string from a window (its cleaning is idempotent on the window);
  the validation on write re-checks that with the reference tokenizers.
* **Windows**. A document is BERT-tokenized once with offsets and cut into windows of at most
  `max_len - 2` tokens, only at word starts (never between a word's pieces), so the window text,
  `doc[start of the first token : end of the last token]`, re-tokenizes to the same ids. A row is
  [CLS] tokens [SEP] padded with [PAD]. A word longer than a whole window is skipped and counted.
* **CLIP blocks**. The window text, lowercased as CLIP does, goes through a fast CLIP BPE built with
  the `tokenizers` library from open_clip's own vocabulary and merges (`clip_fast_tokenizer`). Its
  content tokens fill `n_blocks` blocks of 75: each used block is [SOT] content [EOT] then zeros up
  to 77; an unused block is all zeros. Id 0 is a real token ("!"), so validity comes from the [EOT]
  position (`clip_attention_mask`), never from `id == 0`. Content beyond n_blocks x 75 tokens is cut
  and the window counted as overflow.
* **Alignment**. For BERT position p, `[align_start, align_end)` is the flat CLIP position range
  (flat = block * 77 + position in block) of the CLIP tokens whose character spans overlap the BERT
  token's span; -1/-1 for [CLS], [SEP], padding and tokens whose CLIP tokens were all cut off.
  Both tokenizations are monotone in the text, so each range is contiguous (a range that crosses a
  block boundary also covers that boundary's [EOT] and [SOT]).

Speed (bench/tokenize_speed.py): documents go in chunks to a process pool of `tokenize.workers`, each
worker cleaning, tokenizing and laying out its chunk. Cleaning skips lines ftfy provably leaves alone
(`fix_text`); tokenization runs the Rust tokenizers on each distinct space-separated piece once
(`PieceMemo`); windows, blocks and alignment are numpy over the chunk.
"""
from __future__ import annotations

import functools
import hashlib
import html
import json
import multiprocessing as mp
import os
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import ftfy
import ftfy.badness
import numpy as np
import regex
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from xdbert.errors import PipelineError

CLIP_CONTEXT = 77  # CLIP-T's context: [SOT] + 75 content tokens + [EOT]
CLIP_CONTENT = CLIP_CONTEXT - 2
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # the trained vocabulary's ids 0..4
MIN_MAX_LEN = 8
INT16_MAX = 2**15 - 1  # bert_len and the alignment are stored as int16
CHUNK_CHARS = 1 << 17  # text per pool task: small enough to balance 2 workers on the embedded corpus


# ----------------------------------------------------------------------------------------------
# Cleaning

# ftfy.fix_text is the slowest part of the work, and on almost every line of real text it changes
# nothing. `fix_text` below proves that for a line cheaply and calls ftfy only where it might act.
_FTFY_CONFIG = ftfy.TextFixerConfig(explain=False)
# The character-level steps of ftfy's fix_and_explain, in its order (ftfy 6).
_FTFY_CHAR_FIXERS = ("fix_c1_controls", "fix_latin_ligatures", "fix_character_width", "uncurl_quotes",
                     "fix_line_breaks", "fix_surrogates", "remove_terminal_escapes", "remove_control_chars")
_ASCII_UNSAFE = regex.compile(r"[&\x00-\x08\x0b-\x1f\x7f]")
_CLIP_SPECIAL_TEXT = regex.compile(r"<start_of_text>|<end_of_text>", regex.IGNORECASE)
MAX_CLEAN_PASSES = 4


@functools.lru_cache(maxsize=1)
def _ftfy_unsafe_characters() -> frozenset[str]:
    """Every character some character-level ftfy step changes on its own, plus '&' (HTML entities),
    ESC (terminal escapes) and the surrogates; found by asking the fixers themselves (about 1 s)."""
    text = _all_characters()
    unsafe = {"&", "\x1b"}
    for name in _FTFY_CHAR_FIXERS:
        fixer = ftfy.FIXERS[name]
        todo = [(0, len(text))]
        while todo:  # bisect down to the characters the fixer changes
            lo, hi = todo.pop()
            if fixer(text[lo:hi]) == text[lo:hi]:
                continue
            if hi - lo == 1:
                unsafe.add(text[lo])
            else:
                mid = (lo + hi) // 2
                todo += [(lo, mid), (mid, hi)]
    return frozenset(unsafe) | frozenset(map(chr, range(0xD800, 0xE000)))


_NON_ASCII = regex.compile(r"[^\x00-\x7f]+")
_BADNESS_REACH = 8  # ftfy's mojibake patterns span at most 7 characters


def _looks_bad(segment: str) -> bool:
    """`ftfy.badness.is_bad(segment)`, or True where unsure, searching only near non-ASCII characters.

    Every pattern of ftfy's BADNESS_RE is a few characters long (7 at most) and needs a non-ASCII
    character (tests/test_tokenization.py checks both), so a match lies within `_BADNESS_REACH` of
    some non-ASCII run. Overlapping neighbourhoods are merged and searched; a neighbourhood can only
    add false alarms (its edges look like '^'), which cost a full ftfy call, never a miss. On English
    text this searches a few percent of the characters.
    """
    lo = hi = -1
    for m in _NON_ASCII.finditer(segment):
        a, b = max(m.start() - _BADNESS_REACH, 0), m.end() + _BADNESS_REACH
        if a <= hi:
            hi = b
            continue
        if hi >= 0 and ftfy.badness.is_bad(segment[lo:hi]):
            return True
        lo, hi = a, b
    return hi >= 0 and ftfy.badness.is_bad(segment[lo:hi])


def _ftfy_changes_nothing(segment: str) -> bool:
    """True only if ftfy.fix_text certainly leaves `segment` (one line) as it is.

    ftfy's fix_and_explain returns its input when one pass of its steps changes nothing: no '&' (no
    entity to unescape), not `is_bad` (fix_encoding only acts on text that looks like mojibake), no
    character a character-level step would change, and already NFC.
    """
    if segment.isascii():
        return not _ASCII_UNSAFE.search(segment)
    return (_ftfy_unsafe_characters().isdisjoint(segment) and unicodedata.is_normalized("NFC", segment)
            and not _looks_bad(segment))


def fix_text(text: str) -> str:
    """Exactly `ftfy.fix_text(text)`, faster: lines ftfy would not change are not handed to it.

    Mirrors ftfy's own loop (one segment per line, at most `max_decode_length` characters, HTML
    unescaping switched off for good once a segment contains '<') and gives every other segment to
    `ftfy.fix_and_explain` with the same configuration.
    """
    config = _FTFY_CONFIG
    out = []
    pos = 0
    while pos < len(text):
        brk = text.find("\n", pos) + 1 or len(text)
        if brk - pos > config.max_decode_length:
            brk = pos + config.max_decode_length
        segment = text[pos:brk]
        if config.unescape_html == "auto" and "<" in segment:
            config = config._replace(unescape_html=False)
        out.append(segment if _ftfy_changes_nothing(segment) else ftfy.fix_and_explain(segment, config).text)
        pos = brk
    return "".join(out)


def clean_text(text: str) -> str:
    """CLIP's cleaning for one whole document (see the module docstring); both tokenizers read this."""
    for _ in range(MAX_CLEAN_PASSES):
        fixed = fix_text(text)
        unescaped = html.unescape(html.unescape(fixed)) if "&" in fixed else fixed
        out = " ".join(unescaped.split())
        special = _CLIP_SPECIAL_TEXT.search(out) is not None
        if special:
            out = " ".join(_CLIP_SPECIAL_TEXT.sub(" ", out).split())
        if unescaped == fixed and not special:
            return out  # ftfy's output with only its whitespace collapsed: the usual single pass
        text = out  # an entity or a special string went away: what it left behind gets cleaned too
    return text


def clip_reference_clean(text: str) -> str:
    """What open_clip's SimpleTokenizer does to its input before splitting (lowercasing aside)."""
    from open_clip.tokenizer import _clean_whitespace

    return _clean_whitespace(text)


# ----------------------------------------------------------------------------------------------
# The two tokenizers

_MARK = 0xF0000  # plane-15 private use: where a word's non-initial characters go during training


def _mark(word: str) -> str | None:
    """A word with every character but the first moved to the private-use planes.

    None (the word is left out of training) if it has a character at or above U+20000, which could
    not be moved (U+F0000 + c must stay a code point) or could be taken for a moved one.
    """
    if any(ord(c) >= 0x20000 for c in word):
        return None
    return word[0] + "".join(chr(_MARK + ord(c)) for c in word[1:])


def _unmark(token: str) -> str:
    """Back from `_mark`: a piece that starts inside a word becomes a "##" continuation piece."""
    plain = "".join(chr(ord(c) - _MARK) if ord(c) >= _MARK else c for c in token)
    return "##" + plain if ord(token[0]) >= _MARK else plain


def train_wordpiece(texts: Iterable[str], vocab_size: int, model_max_length: int):
    """A BERT-uncased WordPiece vocabulary trained on `texts`, as a transformers `BertTokenizer`.

    [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4; BERT's normalizer (lowercase, strip accents, CJK
    spacing, control characters) and pre-tokenizer (whitespace and punctuation). `save_pretrained`
    writes a folder that `BertTokenizerFast`/`AutoTokenizer.from_pretrained` load.

    The vocabulary is learned as `tokenizers`' WordPieceTrainer does (BPE merges, "##" pieces inside
    words), but deterministically: that trainer numbers its "##" pieces in hash-map order and breaks
    ties between equally frequent merges by those numbers, so two runs on the same text can give two
    vocabularies (huggingface/tokenizers#1794), and DVC would see a new `models/tokenizer` each time.
    Here a word's inner characters are moved to private-use code points instead of getting a "##"
    prefix; the plain BPE trainer numbers its alphabet in sorted order and is deterministic; the pieces
    are moved back and prefixed afterwards.
    """
    from transformers import BertTokenizer

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()

    def marked_docs() -> Iterator[str]:
        for text in texts:
            words = (_mark(w) for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text)))
            yield " ".join(w for w in words if w)

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bpe.train_from_iterator(marked_docs(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS,
                                                                show_progress=False))
    vocab = {(t if t in BERT_SPECIALS else _unmark(t)): i for t, i in bpe.get_vocab().items()}
    # Rebuilt through BertTokenizer so the saved folder is a standard BERT tokenizer, not a bare one.
    return BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=model_max_length)


def load_encoder_tokenizer(name: str):
    """`AutoTokenizer.from_pretrained(name)` (a hub id or a local folder); offline -> PipelineError."""
    from transformers import AutoTokenizer

    from xdbert.hub import hub_request

    try:
        with hub_request(f"the tokenizer of `model.encoder: {name}`"):
            tok = AutoTokenizer.from_pretrained(name)
    except PipelineError:
        raise
    except (OSError, ValueError) as e:
        raise PipelineError(f"could not load the tokenizer of `model.encoder: {name}`: {e}") from e
    if getattr(tok, "backend_tokenizer", None) is None:
        raise PipelineError(f"the tokenizer of `model.encoder: {name}` has no fast (Rust) backend; the pipeline needs one")
    return tok


def vocab_hash(vocab: dict[str, int]) -> str:
    """sha256 of a vocabulary in id order: two tokenizers with the same hash give the same ids."""
    items = sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def clip_vocab_hash(simple_tokenizer) -> str:
    """sha256 over CLIP's vocabulary and merges (open_clip SimpleTokenizer)."""
    merges = sorted(simple_tokenizer.bpe_ranks, key=simple_tokenizer.bpe_ranks.get)
    h = hashlib.sha256(vocab_hash(simple_tokenizer.encoder).encode())
    h.update(json.dumps(merges, ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


# open_clip's split pattern: the special tokens, then these alternatives, compiled with IGNORECASE.
CLIP_PATTERN_CORE = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


@functools.lru_cache(maxsize=1)
def _all_characters() -> str:
    """Every code point but the surrogates, which no decoded text holds."""
    return "".join(map(chr, chain(range(0xD800), range(0xE000, sys.maxunicode + 1))))


def _codepoint_ranges(pattern: str) -> list[tuple[int, int]]:
    """Code point ranges that `pattern` (a character class) matches under the `regex` module with
    IGNORECASE, exactly as open_clip compiles it."""
    everything = _all_characters()
    ranges: list[tuple[int, int]] = []
    for m in regex.finditer(pattern, everything, flags=regex.IGNORECASE):
        a, b = ord(everything[m.start()]), ord(everything[m.end() - 1])
        for lo, hi in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)) if a < 0xD800 < b else ((a, b),):
            if ranges and lo == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
    return ranges


def _onig_class(ranges: Sequence[tuple[int, int]]) -> str:
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges) + "]"


@functools.lru_cache(maxsize=1)
def clip_split_pattern() -> str:
    """CLIP's split regex for the `tokenizers` library (Oniguruma), equal to open_clip's on any text.

    open_clip matches `[\\p{L}]`, `[\\p{N}]` and `[^\\s\\p{L}\\p{N}]` case-insensitively with the
    `regex` module's Unicode tables; case-insensitive classes are not plain Unicode categories (U+0345,
    which folds to a Greek iota, belongs to none and is dropped) and Oniguruma's tables may be of
    another Unicode version. So every class is spelled out as the explicit code point ranges the
    `regex` module itself matches, and each contraction letter as the characters it matches.
    """
    contraction = []
    for c in ("s", "t", "re", "ve", "m", "ll", "d"):
        contraction.append("'" + "".join(_onig_class(_codepoint_ranges(regex.escape(ch))) for ch in c))
    letters = _onig_class(_codepoint_ranges(r"[\p{L}]+"))
    digits = _onig_class(_codepoint_ranges(r"[\p{N}]+"))
    other = _onig_class(_codepoint_ranges(r"[^\s\p{L}\p{N}]+"))
    return "|".join(contraction) + f"|{letters}+|{digits}|{other}+"


def clip_fast_tokenizer(name: str) -> Tokenizer:
    """A Rust (`tokenizers`) CLIP BPE equal to open_clip's SimpleTokenizer on lowercased cleaned text.

    Built from the SimpleTokenizer's own vocabulary (`encoder`) and merges (`bpe_ranks`): CLIP's
    split regex (`clip_split_pattern`), GPT-2's byte-to-unicode mapping, and BPE with the `</w>`
    end-of-word suffix. Lowercasing is left to the caller (Python's `str.lower`, as open_clip), who
    maps the offsets back when lowercasing changes a length; `DualTokenizer` does.
    """
    from xdbert.clip import clip_tokenizer

    st = clip_tokenizer(name)
    if not st.pat.pattern.endswith(CLIP_PATTERN_CORE):
        raise PipelineError(f"`model.clip: {name}`: open_clip's CLIP tokenizer uses a split pattern this pipeline does not know ({st.pat.pattern!r})")
    merges = sorted(st.bpe_ranks, key=st.bpe_ranks.get)
    bpe = models.BPE(vocab=dict(st.encoder), merges=list(merges), end_of_word_suffix="</w>",
                     continuing_subword_prefix="", fuse_unk=False, cache_capacity=200_000)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(clip_split_pattern()), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # open_clip turns these strings into the special ids; clean_text removes them from the corpus.
    specials = [st.decoder[i] for i in st.all_special_ids]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


# ----------------------------------------------------------------------------------------------
# Windows, blocks and alignment

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
        from xdbert.shards import bert_dtype

        return bert_dtype(self.bert_vocab_size)


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


def clip_attention_mask(clip_ids: np.ndarray, eot_id: int, n_blocks: int | None = None) -> np.ndarray:
    """Valid positions of CLIP blocks: (..., n_blocks*77) ids -> (..., n_blocks, 77) bool.

    Convention: a used block is [SOT] content [EOT] then zeros, an unused block is all zeros. Id 0 is
    the real token "!", so a position is valid when it is at or before its block's [EOT], and a block
    without [EOT] is unused (all False). The cleaned text has no `<end_of_text>`, so content never
    holds an [EOT]. Same convention as `xdbert.clip.clip_block_mask` (torch).
    """
    ids = np.asarray(clip_ids)
    n_blocks = n_blocks or ids.shape[-1] // CLIP_CONTEXT
    blocks = ids.reshape(*ids.shape[:-1], n_blocks, CLIP_CONTEXT)
    is_eot = blocks == eot_id
    eot_pos = is_eot.argmax(axis=-1)[..., None]
    return (np.arange(CLIP_CONTEXT) <= eot_pos) & is_eot.any(axis=-1, keepdims=True)


def clip_content(row: np.ndarray, eot_id: int) -> list[int]:
    """The content ids of one window's CLIP blocks, in order, without [SOT]/[EOT]/padding."""
    mask = clip_attention_mask(row, eot_id)
    blocks = np.asarray(row).reshape(mask.shape)
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

    COLUMNS = ("bert_ids", "bert_len", "clip_ids", "align_start", "align_end", "doc_index")

    def __len__(self) -> int:
        return len(self.bert_len)

    @property
    def overflow(self) -> np.ndarray:
        return self.clip_tokens > (self.clip_ids.shape[1] // CLIP_CONTEXT) * CLIP_CONTENT

    def rows(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in self.COLUMNS}


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


def concat_windows(parts: Sequence[Windows]) -> Windows:
    """One `Windows` from several (in order); the counters are summed."""
    arrays = {k: np.concatenate([getattr(p, k) for p in parts]) for k in
              ("bert_ids", "bert_len", "clip_ids", "align_start", "align_end", "doc_index", "char_span", "clip_tokens")}
    examples = [p.unaligned_example for p in parts if p.unaligned_example]
    return Windows(**arrays, docs=sum(p.docs for p in parts), dropped_words=sum(p.dropped_words for p in parts),
                   unaligned=sum(p.unaligned for p in parts), unaligned_example=examples[0] if examples else None)


# ----------------------------------------------------------------------------------------------
# Process pool

_WORKER: DualTokenizer | None = None


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
    _ftfy_unsafe_characters()  # computed once here, inherited by the workers
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


# ----------------------------------------------------------------------------------------------
# The stage's work: tokenizer, shards, validation, manifest

@dataclass(frozen=True)
class Settings:
    """The `tokenize` params section, checked."""

    vocab_size: int
    max_len: int
    n_blocks: int
    shard_windows: int
    max_overflow: float
    validate_windows: int
    workers: int

    @classmethod
    def from_params(cls, sec: dict) -> "Settings":
        from xdbert import params as P

        def get(key: str):
            return P.get(sec, key, "tokenize")

        max_len = P.positive(get("max_len"), "tokenize.max_len")
        if not MIN_MAX_LEN <= max_len <= INT16_MAX:
            raise PipelineError(f"`tokenize.max_len` must be between {MIN_MAX_LEN} ([CLS] + 6 tokens + [SEP]) and the encoder's positions; got {max_len}")
        n_blocks = P.positive(get("n_blocks"), "tokenize.n_blocks")
        if n_blocks * CLIP_CONTEXT > INT16_MAX:
            raise PipelineError(f"`tokenize.n_blocks` must be at most {INT16_MAX // CLIP_CONTEXT} (alignment positions are int16); got {n_blocks}")
        validate = get("validate_windows")
        if not isinstance(validate, int) or isinstance(validate, bool) or validate < 0:
            raise PipelineError(f"`tokenize.validate_windows` must be a non-negative integer; got {validate!r}")
        return cls(
            vocab_size=P.positive(get("vocab_size"), "tokenize.vocab_size"),
            max_len=max_len,
            n_blocks=n_blocks,
            shard_windows=P.positive(get("shard_windows"), "tokenize.shard_windows"),
            max_overflow=P.fraction(get("max_overflow"), "tokenize.max_overflow"),
            validate_windows=validate,
            workers=P.positive(get("workers"), "tokenize.workers"),
        )


def encoder_positions(encoder: str, encoder_config: dict | None = None, tokenizer=None) -> int | None:
    """How many positions the language encoder has (the upper bound of `tokenize.max_len`).

    `random:<model_type>`: `encoder_config.max_position_embeddings`, else the model type's default.
    Pretrained: its config's max_position_embeddings (a folder without config.json: the tokenizer's
    `model_max_length`). None when nothing states a limit.
    """
    if encoder.startswith("random:"):
        from transformers import CONFIG_MAPPING

        model_type = encoder.split(":", 1)[1]
        if model_type not in CONFIG_MAPPING:
            raise PipelineError(f"unknown model type in `model.encoder: {encoder}`; use random:<a transformers model type> such as random:bert or random:electra")
        n = (encoder_config or {}).get("max_position_embeddings")
        return int(n) if n else getattr(CONFIG_MAPPING[model_type](), "max_position_embeddings", None)
    limits = []
    if not Path(encoder).is_dir() or (Path(encoder) / "config.json").is_file():
        from transformers import AutoConfig

        from xdbert.hub import hub_request

        try:
            with hub_request(f"the config of `model.encoder: {encoder}`"):
                config = AutoConfig.from_pretrained(encoder)
        except PipelineError:
            raise
        except (OSError, ValueError) as e:
            raise PipelineError(f"could not load the config of `model.encoder: {encoder}`: {e}") from e
        if getattr(config, "max_position_embeddings", None):
            limits.append(int(config.max_position_embeddings))
    if tokenizer is not None and 0 < getattr(tokenizer, "model_max_length", 0) < 10**9:
        limits.append(int(tokenizer.model_max_length))
    return min(limits) if limits else None


def check_max_len(settings: Settings, positions: int | None, encoder: str) -> None:
    if positions is not None and settings.max_len > positions:
        raise PipelineError(f"`tokenize.max_len` = {settings.max_len} is above the {positions} positions of `model.encoder: {encoder}`; use at most {positions}")


def corpus_paths(corpus_dir: str | Path) -> dict[str, Path]:
    """data/corpus/{train,valid}.parquet, which must exist."""
    paths = {s: Path(corpus_dir) / f"{s}.parquet" for s in ("train", "valid")}
    for p in paths.values():
        if not p.is_file():
            raise PipelineError(f"missing corpus file {p}: run `dvc repro corpus` first")
    return paths


def read_corpus(path: Path) -> list[str]:
    """The `text` column of a corpus split (one document per row)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise PipelineError(f"cannot read corpus file {path} ({e}): rerun `dvc repro corpus`") from e
    if "text" not in table.column_names:
        raise PipelineError(f"corpus file {path} has no `text` column (it has {table.column_names}): rerun `dvc repro corpus`")
    return [t or "" for t in table.column("text").to_pylist()]


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
    from xdbert.io import atomic_path, write_json
    from xdbert.shards import ShardWriter, build_manifest, open_shards

    paths = corpus_paths(corpus_dir)
    raw = {s: read_corpus(p) for s, p in paths.items()}
    n_bytes = sum(len(t.encode("utf-8")) for docs in raw.values() for t in docs)
    reference_clip = clip_tokenizer(clip_name)

    with atomic_path(tokenizer_dir, is_dir=True) as tok_tmp, atomic_path(shard_dir, is_dir=True) as shard_tmp:
        cleaned: dict[str, list[str]] = {}
        t_clean = 0.0
        if encoder.startswith("random:"):
            t0 = time.perf_counter()
            cleaned["train"] = clean_docs(raw["train"], settings.workers)
            t_clean = time.perf_counter() - t0
            bert = train_wordpiece(cleaned["train"], settings.vocab_size, positions or settings.max_len)
        else:
            bert = encoder_tokenizer if encoder_tokenizer is not None else load_encoder_tokenizer(encoder)
        bert.save_pretrained(str(tok_tmp))
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
                                  splits=splits, extra={"cleaning": "xdbert.tokenization.clean_text (CLIP's basic_clean + whitespace_clean, special strings removed)"})
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


def _check_split(split: str, res: SplitResult, path: Path, settings: Settings) -> None:
    if res.windows == 0:
        raise PipelineError(f"corpus file {path} gives no windows ({res.docs} documents, none with text): rerun `dvc repro corpus` or check its params")
    share = res.overflow / res.windows
    if share > settings.max_overflow:
        raise PipelineError(
            f"{share:.2%} of the {split} windows ({res.overflow} of {res.windows}) have more CLIP tokens than "
            f"tokenize.n_blocks x 75 = {settings.n_blocks * CLIP_CONTENT}, above tokenize.max_overflow = {settings.max_overflow:.2%}: "
            f"raise tokenize.n_blocks or lower tokenize.max_len")
    if res.unaligned:
        raise PipelineError(f"{res.unaligned} BERT tokens of the {split} windows have no CLIP tokens although their text was not cut off, e.g. {res.unaligned_example}")


def validation_sample(res: SplitResult, n: int) -> list[int]:
    """`n` windows to re-check, deterministic: the first, the longest text, the most CLIP tokens, then random."""
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
