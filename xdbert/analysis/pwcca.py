"""The `pwcca` stage's library (paper Table 2): its settings, the words the vocabularies share, the table.

Table 2 compares the word-embedding matrices of each family's encoder, CLIP's text tower and uniform noise
over the whole words every vocabulary has. The CCA and PWCCA themselves are xdbert/analysis/cca.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from xdbert import params as P
from xdbert.analysis import cca
from xdbert.errors import PipelineError
from xdbert.model.files import CLIP_CONFIG
from xdbert.model.families import family_names
from xdbert.paths import PRETRAIN_CLIP

CONVENTION_TEXT = {"svcca": "google/svcca's `compute_pwcca`, directions `(x - mean) U` without whitening, means added back "
                            "(which makes PWCCA depend on the signs the SVD gives its singular vectors, by up to 0.02 "
                            "on synthetic views; svcca's values have the same dependence)",
                   "whitened": "the whitened canonical variates of Morcos et al.'s text"}
# Table 2's systems besides the study's families (each family's encoder before adaptation)
CLIP, RANDOM = "clip", "random"
# Table 2 of the paper (BERT-base, ELECTRA-base, CLIP ViT-B/32), keyed by the systems' labels: the paper
# profile's families BERT-b and ELECTRA-b are the paper's BERT and ELECTRA
PAPER = {("BERT-b", "ELECTRA-b"): 0.5498, ("BERT-b", "CLIP"): 0.4980, ("ELECTRA-b", "CLIP"): 0.4645,
         ("BERT-b", "RANDOM"): 0.3569}


# ----------------------------------------------------------------------------------------------------
# The `pwcca` params
# ----------------------------------------------------------------------------------------------------

PWCCA_KEYS = ("clip_tower", "pairs", "eps", "convention", "weight_by", "min_words_ratio", "seed")  # a typo: refused


@dataclass(frozen=True)
class PwccaSettings:
    """The `pwcca` params section, checked.

    `families` are the families the stage loads: those the pairs name, in the order they first appear.
    RANDOM is shaped like the first of them; where the pairs name no family ([clip, random] alone) that is
    the study's first family, the one loaded. `eps` is kept as written (it is reported as given);
    `clip_tower` empty means the tower the adaptation starts from (`models/pretrain_clip`).
    """

    pairs: tuple[tuple[str, str], ...]
    families: tuple[str, ...]
    eps: Any
    convention: str
    weight_by: str
    min_words_ratio: float
    seed: int
    clip_tower: str

    @classmethod
    def from_params(cls, params: dict, files: bool = True) -> "PwccaSettings":
        """`files`: also check that `clip_tower` is a saved tower (False: the values only, as `xdbert check`)."""
        sec = P.section(params, "pwcca", PWCCA_KEYS)
        get = P.getter(sec, "pwcca")

        study = family_names(params)
        clash = [name for name in study if name in (CLIP, RANDOM)]
        if clash:
            raise PipelineError(f"`families` has the name {clash[0]!r}, which `pwcca.pairs` reads as one of its own systems "
                                f"({CLIP}, {RANDOM}); rename the family")
        allowed = f"a family of `families` ({', '.join(study)}), {CLIP} or {RANDOM}"
        pairs = get("pairs")
        if not isinstance(pairs, list) or not pairs:
            raise PipelineError(f"`pwcca.pairs` must be a non-empty list of [a, b] pairs, each {allowed}; got {pairs!r}")
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]:
                raise PipelineError(f"entry {pair!r} of `pwcca.pairs` must be two different systems, e.g. [{study[0]}, {CLIP}]")
            for name in pair:
                if name not in study and name not in (CLIP, RANDOM):
                    raise PipelineError(f"unknown system {name!r} in `pwcca.pairs`; allowed: {allowed}")
        families = tuple(dict.fromkeys(name for pair in pairs for name in pair if name in study)) or (study[0],)
        eps = get("eps")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < float("inf"):  # not NaN either
            raise PipelineError(f"`pwcca.eps` must be a number >= 0; got {eps!r}")
        convention = P.choice(get("convention"), "pwcca.convention", cca.CONVENTIONS)
        weight_by = P.choice(get("weight_by"), "pwcca.weight_by", cca.WEIGHT_VIEWS)
        min_words_ratio = P.positive(get("min_words_ratio"), "pwcca.min_words_ratio", float)
        seed = P.non_negative(get("seed"), "pwcca.seed")
        clip_tower = get("clip_tower")
        if not isinstance(clip_tower, str):
            raise PipelineError(f'`pwcca.clip_tower` must be a saved CLIP tower folder, or "" for {PRETRAIN_CLIP}; got {clip_tower!r}')
        settings = cls(tuple(tuple(pair) for pair in pairs), families, eps, convention, weight_by, min_words_ratio, seed,
                       clip_tower)
        if files:
            settings.check_files()
        return settings

    def check_files(self) -> None:
        """`clip_tower`, where given, is a saved tower."""
        if self.clip_tower and not (Path(self.clip_tower) / CLIP_CONFIG).is_file():
            raise PipelineError(f"`pwcca.clip_tower: {self.clip_tower}` is not a saved CLIP tower folder (no {CLIP_CONFIG}); "
                                f"leave it empty for the tower the adaptation starts from ({PRETRAIN_CLIP})")

    @property
    def systems(self) -> tuple[str, ...]:
        """The systems the pairs compare, in the order they first appear."""
        return tuple(dict.fromkeys(name for pair in self.pairs for name in pair))



# ----------------------------------------------------------------------------------------------------
# Word embeddings over the words two vocabularies share
# ----------------------------------------------------------------------------------------------------

def _plain_word(word: str) -> bool:
    """A lowercase ASCII alphabetic word: the form both uncased WordPiece and CLIP's BPE keep whole."""
    return word.isascii() and word.isalpha() and word.islower()


def wordpiece_words(vocab: Mapping[str, int]) -> dict[str, int]:
    """Whole words of a WordPiece vocabulary (BERT, ELECTRA): `word` -> id.

    Continuation pieces (`##ing`), specials (`[CLS]`), `[unused0]`, punctuation, digits and cased or
    non-ASCII entries are left out: only a token that is a complete lowercase word is comparable with
    another vocabulary's entry for the same word.
    """
    return {tok: int(i) for tok, i in vocab.items() if _plain_word(tok)}


def clip_bpe_words(encoder: Mapping[str, int]) -> dict[str, int]:
    """Whole words of CLIP's BPE vocabulary: entries `word</w>` (a word-final token) -> id, keyed `word`.

    A token without `</w>` is a word-initial or inner piece (`defe` of `defe ctive`), not a word.
    """
    suffix = "</w>"
    out = {}
    for tok, i in encoder.items():
        if tok.endswith(suffix) and _plain_word(tok[: -len(suffix)]):
            out[tok[: -len(suffix)]] = int(i)
    return out


def shared_words(vocabs: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Sorted words present in every vocabulary of `vocabs` (name -> {word: id}); PipelineError if none."""
    names = list(vocabs)
    if not names:
        raise ValueError("no vocabularies given")
    common = set(vocabs[names[0]])
    for name in names[1:]:
        common &= set(vocabs[name])
    if not common:
        sizes = ", ".join(f"{n}: {len(vocabs[n])} whole words" for n in names)
        raise PipelineError(f"the vocabularies share no whole word ({sizes}); PWCCA needs the same words in every "
                            f"embedding matrix: check that the models are the intended ones")
    return sorted(common)


def embedding_rows(matrix: np.ndarray, word_ids: Mapping[str, int], words: Iterable[str]) -> np.ndarray:
    """(len(words), dim) float64 rows of an embedding matrix for `words`, in that order."""
    matrix = np.asarray(matrix)
    ids = np.fromiter((word_ids[w] for w in words), dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= matrix.shape[0]):
        raise PipelineError(f"a token id is outside the embedding matrix ({matrix.shape[0]} rows): the vocabulary "
                            f"does not belong to this model")
    return matrix[ids].astype(np.float64)


def uniform_noise(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Table 2's RANDOM: U[-1, 1) noise of `shape`, reproducible from `seed`."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=shape)


def pairwise(views: Mapping[str, np.ndarray], pairs: Iterable[tuple[str, str]], eps: float = 1e-6,
             weight_by: str = "smaller", min_ratio: float = cca.DEFAULT_MIN_RATIO,
             convention: str = "svcca") -> dict[tuple[str, str], cca.PWCCAResult]:
    """PWCCA of every (a, b) in `pairs` between the named views (all over the same words); too few words for
    their widths is a PipelineError naming `pwcca.min_words_ratio`."""
    out = {}
    for a, b in pairs:
        for name in (a, b):
            if name not in views:
                raise PipelineError(f"unknown PWCCA system {name!r}; available: {', '.join(views)}")
        try:
            out[(a, b)] = cca.pwcca(views[a], views[b], eps=eps, weight_by=weight_by, min_ratio=min_ratio,
                                    convention=convention)
        except cca.TooFewPoints as e:
            raise PipelineError(f"{e} (param `pwcca.min_words_ratio`); use vocabularies that share more whole words, "
                                f"or lower the ratio knowingly") from None
    return out


# ----------------------------------------------------------------------------------------------------
# Table 2
# ----------------------------------------------------------------------------------------------------

def system_labels(family_labels: Mapping[str, str]) -> dict[str, str]:
    """Each system's name in Table 2's rows: a family's label (BERT-b), then CLIP and RANDOM as the paper writes them."""
    return {**family_labels, CLIP: "CLIP", RANDOM: "RANDOM"}


def system_names(labels: Mapping[str, str], encoders: Mapping[str, str], clip: str, random_like: str) -> dict[str, str]:
    """What each system is, after its label: `encoders` maps the loaded families to their encoders, `labels` every
    system to its label, `random_like` names the family RANDOM is shaped like."""
    return {**{name: f"{labels[name]} ({encoder})" for name, encoder in encoders.items()},
            CLIP: f"{labels[CLIP]} (CLIP-T {clip})",
            RANDOM: f"{labels[RANDOM]} (U[-1, 1) noise shaped like {labels[random_like]}'s rows)"}


def table2_rows(results: Mapping[tuple[str, str], cca.PWCCAResult], views: Mapping[str, np.ndarray], n_shared: int,
                labels: Mapping[str, str], paper: bool) -> list[dict]:
    """One record per compared pair (results/pwcca.json); `paper`: with the paper's value beside the pairs it has."""
    rows = []
    for (a, b), r in results.items():
        la, lb = labels[a], labels[b]
        rows.append({"a": a, "b": b, "pwcca": round(r.value, 6), "shared_words": n_shared,
                     "widths": [int(views[a].shape[1]), int(views[b].shape[1])], "weighted_by": r.weighted_by,
                     "mean_cca": round(float(np.mean(r.rho)), 6), "paper": PAPER.get((la, lb), PAPER.get((lb, la))) if paper else None})
    return rows


def table2_markdown(head: str, rows: list[dict], labels: Mapping[str, str], names: Mapping[str, str], n_shared: int,
                    settings: PwccaSettings, paper: bool) -> str:
    """reports/table2.md: `head` (the report header), then the table of `rows` and what it compares."""
    s = settings
    md = [head,
          f"Embedding rows of the ORIGINAL (pre-adaptation) models over **{n_shared} shared words**: whole lowercase "
          f"words present in every compared vocabulary (WordPiece `word`, CLIP BPE `word</w>`); a `random:` encoder is "
          f"its pretrain_encoder stand-in; RANDOM's noise has seed {s.seed}. PWCCA: projection-weighted mean of the "
          f"canonical correlations (Morcos et al., 2018), weights from the {s.weight_by} view, covariance ridge "
          f"eps={s.eps}, **{s.convention}** convention: {CONVENTION_TEXT[s.convention]}.",
          "", "The RANDOM row is the level two unrelated matrices reach with this many words and these widths (CCA "
          "fits noise with few words per dimension); compare the other rows with it, not with 0.",
          "", "| systems | PWCCA | mean CCA | shared words | widths |" + (" paper |" if paper else ""),
          "|---|---|---|---|---|" + ("---|" if paper else "")]
    for r in rows:
        line = (f"| {labels[r['a']]}/{labels[r['b']]} | {r['pwcca']:.4f} | {r['mean_cca']:.4f} | {r['shared_words']} | "
                f"{r['widths'][0]} / {r['widths'][1]} |")
        md.append(line + (f" {'-' if r['paper'] is None else format(r['paper'], '.4f')} |" if paper else ""))
    md += ["", "Systems: " + "; ".join(names[k] for k in s.systems) + "."]
    return "\n".join(md) + "\n"
