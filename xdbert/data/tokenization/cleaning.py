"""Cleaning: every document is cleaned once, with CLIP's own cleaning, and both tokenizers read the result.

The rule is open_clip's `basic_clean` (ftfy.fix_text, html.unescape twice, strip) and `whitespace_clean`
(runs of whitespace become one space), plus the removal of CLIP's special-token strings
(`<start_of_text>`, `<end_of_text>`, in any case) so a real end token never appears inside the content.
It is repeated while the unescaping or the removal still changes the text (one pass for real text).
CLIP's reference tokenizer, which cleans its input itself, gets back the very same string from a
window (its cleaning is idempotent on the window); the validation on write re-checks that with the
reference tokenizers.
"""
from __future__ import annotations

import functools
import html
import sys
import unicodedata
from itertools import chain

import ftfy
import ftfy.badness
import regex

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
def all_characters() -> str:
    """Every code point but the surrogates, which no decoded text holds."""
    return "".join(map(chr, chain(range(0xD800), range(0xE000, sys.maxunicode + 1))))


@functools.lru_cache(maxsize=1)
def ftfy_unsafe_characters() -> frozenset[str]:
    """Every character some character-level ftfy step changes on its own, plus '&' (HTML entities),
    ESC (terminal escapes) and the surrogates; found by asking the fixers themselves (about 1 s)."""
    text = all_characters()
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
    return (ftfy_unsafe_characters().isdisjoint(segment) and unicodedata.is_normalized("NFC", segment)
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
