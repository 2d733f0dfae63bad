"""The CLIP side: open_clip's BPE as a fast (Rust) tokenizer that gives the same ids on cleaned text.

The window text, lowercased as CLIP does, goes through a fast CLIP BPE built with the `tokenizers`
library from open_clip's own vocabulary and merges (`clip_fast_tokenizer`); `DualTokenizer` lays its
tokens out in blocks.
"""
from __future__ import annotations

import functools
from typing import Sequence

import regex
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

from xdbert.data.tokenization.cleaning import all_characters
from xdbert.errors import PipelineError

# open_clip's split pattern: the special tokens, then these alternatives, compiled with IGNORECASE.
CLIP_PATTERN_CORE = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _codepoint_ranges(pattern: str) -> list[tuple[int, int]]:
    """Code point ranges that `pattern` (a character class) matches under the `regex` module with
    IGNORECASE, exactly as open_clip compiles it."""
    everything = all_characters()
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
