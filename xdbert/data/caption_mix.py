"""What the caption readers take of the `mechanism` section, apart from data/mechanism.py (the section's keys), so
that an edit there reruns only the stages that read the whole study: the share of caption text among training
windows, which the CLIP stand-in and the caption control both mix at, and the attribute words the control masks
more often.
"""
from __future__ import annotations

from xdbert import params as P
from xdbert.data.synthetic.words import PATTERNS
from xdbert.errors import PipelineError


def caption_share(params: dict) -> float:
    """`mechanism.caption_share`, checked."""
    return P.fraction(P.get(P.section(params, "mechanism"), "caption_share", "mechanism"), "mechanism.caption_share")


def attribute_words(params: dict) -> tuple[str, ...]:
    """`mechanism.patterns`, checked: distinct words of `words.PATTERNS`, none or at least two."""
    patterns = P.get(P.section(params, "mechanism"), "patterns", "mechanism")
    P.subset(patterns, "mechanism.patterns", PATTERNS, nonempty=False)
    if len(set(patterns)) != len(patterns) or len(patterns) == 1:
        raise PipelineError(f"`mechanism.patterns` must list distinct words of {', '.join(PATTERNS)}, none or at "
                            f"least two (the facts contrast them); got {patterns!r}")
    return tuple(patterns)


def corpus_rows(n_captions: int, n_corpus: int, share: float):
    """The corpus rows (indices) that go beside `n_captions` caption rows so that the captions are `share` of the
    whole: the first ones in order, wrapping round."""
    import numpy as np

    if not 0 < share <= 1 or not n_captions or not n_corpus:
        raise ValueError(f"a caption share in (0, 1] of non-empty captions and corpus; got {share}, "
                         f"{n_captions} caption and {n_corpus} corpus rows")
    return np.arange(round(n_captions * (1 - share) / share)) % n_corpus
