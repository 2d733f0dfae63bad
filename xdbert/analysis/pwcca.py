"""Canonical correlation analysis and projection-weighted CCA (PWCCA) of two sets of vectors.

Paper Table 2 compares the word-embedding matrices of BERT, ELECTRA, CLIP's text tower and uniform
noise over the words the vocabularies share. Each embedding matrix is one "view" of the same words:
rows are words (data points), columns are embedding dimensions ("neurons" in the SVCCA papers).

CCA finds directions a_i, b_i such that the projections x a_i and y b_i are maximally correlated, with
each new pair uncorrelated to the previous ones; the correlations rho_1 >= rho_2 >= ... are the
canonical correlations. PWCCA (Morcos, Raghu and Bengio, 2018) summarises them as a weighted mean in
which a canonical direction counts as much as it accounts for the original dimensions of one view,
so directions that merely fit noise in a few dimensions count little.

Two conventions for the weights (param `pwcca.convention`); the canonical correlations are the same:
  svcca     as google/svcca's `compute_pwcca` computes them, which PWCCA papers (and most likely this one)
            ran: the directions are the weighting view's centred columns rotated by the SVD's singular
            vectors, `(x - mean) U`, *without* the whitening, with the column means added back; weights
            sum the projections of the raw (uncentred) columns. Its covariances are scaled by their
            largest entry, dimensions whose scaled variance is below `eps` are dropped, and `eps` is added
            to the scaled diagonals. Where the second view is the narrower one, svcca indexes the first
            view with the second's mask and raises IndexError (its PR #9); here that case weights by the
            second view, as the code intends. Adding a column's mean to a direction is not invariant to
            the sign of the direction's singular-vector pair, which the SVD leaves open: flipping signs
            moved PWCCA by up to 0.02 on one synthetic pair (0.938-0.957), and `pwcca(y, x)` can differ
            from `pwcca(x, y)`. The value is the one LAPACK's signs give, as in svcca itself.
  whitened  the canonical variates of Morcos et al.'s text, `(x - mean) Sxx^-1/2 U`, and the centred
            columns; `eps` times the mean variance is added to both diagonals.
On the same views the two agree on the mean CCA but differ on PWCCA by as much as Table 2's gaps
(0.02-0.13 on synthetic views), so each report says which ran; tests/test_pwcca.py checks `svcca`
against values google/svcca computed (../shared/pwcca_reference).

Method of the `whitened` CCA (all float64):
  1. centre both views;
  2. covariances Sxx, Syy, Sxy, with `eps` times the mean variance added to the diagonals of Sxx and
     Syy (a ridge relative to the data's scale, so near-singular covariances stay invertible and the
     result does not depend on the unit of the embeddings);
  3. whiten: T = Sxx^-1/2 Sxy Syy^-1/2; the singular values of T are the canonical correlations and
     Sxx^-1/2 U, Syy^-1/2 V the canonical coefficient vectors.

Written for this project from the papers and google/svcca's documented behaviour (its code was not copied).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.model.settings import family_names
from xdbert.paths import CLIP_CONFIG, PRETRAIN_CLIP

WEIGHT_VIEWS = ("x", "y", "smaller")
CONVENTIONS = ("svcca", "whitened")
CONVENTION_TEXT = {"svcca": "google/svcca's `compute_pwcca`, directions `(x - mean) U` without whitening, means added back "
                            "(which makes PWCCA depend on the signs the SVD gives its singular vectors, by up to 0.02 "
                            "on synthetic views; svcca's values have the same dependence)",
                   "whitened": "the whitened canonical variates of Morcos et al.'s text"}
DEFAULT_MIN_RATIO = 5.0
# Table 2's systems besides the study's families (each family's encoder before adaptation)
CLIP, RANDOM = "clip", "random"
# Table 2 of the paper (BERT-base, ELECTRA-base, CLIP ViT-B/32), keyed by the systems' labels: the paper
# profile's families BERT-b and ELECTRA-b are the paper's BERT and ELECTRA
PAPER = {("BERT-b", "ELECTRA-b"): 0.5498, ("BERT-b", "CLIP"): 0.4980, ("ELECTRA-b", "CLIP"): 0.4645,
         ("BERT-b", "RANDOM"): 0.3569}


# ----------------------------------------------------------------------------------------------------
# The `pwcca` params
# ----------------------------------------------------------------------------------------------------

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
        sec = P.section(params, "pwcca")
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
        convention = P.choice(get("convention"), "pwcca.convention", CONVENTIONS)
        weight_by = P.choice(get("weight_by"), "pwcca.weight_by", WEIGHT_VIEWS)
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


@dataclass
class CCAResult:
    """Canonical correlations of two views and what is needed to project onto them.

    rho:     (k,) canonical correlations, descending, in [0, 1]; k = min(d1, d2)
    x_coef:  (d1, k) coefficients: the canonical variates of x are (x - x_mean) @ x_coef
    y_coef:  (d2, k) likewise for y
    x_mean, y_mean: the per-dimension means removed before the analysis
    """

    rho: np.ndarray
    x_coef: np.ndarray
    y_coef: np.ndarray
    x_mean: np.ndarray
    y_mean: np.ndarray

    def x_variates(self, x: np.ndarray) -> np.ndarray:
        """(n, k) canonical variates of view x (unit variance, mutually uncorrelated)."""
        return (np.asarray(x, dtype=np.float64) - self.x_mean) @ self.x_coef

    def y_variates(self, y: np.ndarray) -> np.ndarray:
        return (np.asarray(y, dtype=np.float64) - self.y_mean) @ self.y_coef


@dataclass
class PWCCAResult:
    """The PWCCA value and its parts: weights (k,) sum to 1, rho (k,) the canonical correlations."""

    value: float
    weights: np.ndarray
    rho: np.ndarray
    weighted_by: str   # "x" or "y": the view whose dimensions the weights measure
    convention: str    # one of CONVENTIONS


def _as_views(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"views must be 2-D (words x dimensions); got shapes {x.shape} and {y.shape}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"views must have the same rows (words); got {x.shape[0]} and {y.shape[0]}")
    if x.shape[0] < 2:
        raise ValueError("CCA needs at least two data points")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("views contain NaN or infinite values")
    return x, y


def _inv_sqrt(cov: np.ndarray) -> np.ndarray:
    """Symmetric inverse square root of a covariance matrix (eigenvalues floored just above zero)."""
    w, v = np.linalg.eigh(cov)
    floor = max(float(w.max()), 1e-300) * 1e-12  # a numerically zero eigenvalue must not become inf
    w = np.maximum(w, floor)
    return (v / np.sqrt(w)) @ v.T


def _centred_covariances(x: np.ndarray, y: np.ndarray):
    """((x_mean, y_mean), (x centred, y centred), (Sxx, Syy, Sxy)) with the unbiased (n - 1) normalisation."""
    n = x.shape[0]
    x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - x_mean, y - y_mean
    return (x_mean, y_mean), (xc, yc), (xc.T @ xc / (n - 1), yc.T @ yc / (n - 1), xc.T @ yc / (n - 1))


def _ridge(cov: np.ndarray, eps: float) -> np.ndarray:
    return cov + eps * (np.trace(cov) / cov.shape[0]) * np.eye(cov.shape[0])


def cca(x: np.ndarray, y: np.ndarray, eps: float = 1e-6) -> CCAResult:
    """Canonical correlations between views x (n, d1) and y (n, d2); the widths may differ.

    Args:
      x, y: the two views, rows are the same n data points (words) in the same order.
      eps: ridge added to both covariance diagonals, as a fraction of the view's mean variance
        (0 for plain CCA; a small value keeps a near-singular covariance invertible).

    Returns:
      A `CCAResult` with k = min(d1, d2) canonical correlations in descending order.
    """
    x, y = _as_views(x, y)
    if eps < 0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    (x_mean, y_mean), _, (sxx, syy, sxy) = _centred_covariances(x, y)
    wx, wy = _inv_sqrt(_ridge(sxx, eps)), _inv_sqrt(_ridge(syy, eps))
    u, s, vt = np.linalg.svd(wx @ sxy @ wy, full_matrices=False)
    k = min(x.shape[1], y.shape[1])
    # Rounding can push a perfect correlation a hair above 1; a correlation cannot exceed 1.
    rho = np.clip(s[:k], 0.0, 1.0)
    return CCAResult(rho=rho, x_coef=wx @ u[:, :k], y_coef=wy @ vt.T[:, :k], x_mean=x_mean, y_mean=y_mean)


def check_sample_size(n_words: int, d1: int, d2: int, min_ratio: float = DEFAULT_MIN_RATIO) -> None:
    """Refuse an analysis with too few data points for the widths.

    With n close to the width, CCA finds near-perfect correlations between ANY two views (it has as
    many free directions as data points), so the numbers would say nothing. Raises PipelineError.
    """
    need = int(np.ceil(min_ratio * max(d1, d2)))
    if n_words < need:
        raise PipelineError(
            f"PWCCA over {n_words} shared words is not meaningful for embedding widths {d1} and {d2}: it needs at "
            f"least {min_ratio:g}x the larger width, i.e. {need} words (param `pwcca.min_words_ratio`); use "
            f"vocabularies that share more whole words, or lower the ratio knowingly")


def _pinv_sqrt(cov: np.ndarray) -> np.ndarray:
    """Square root of the pseudo-inverse of a covariance: directions with no variance get 0, not inf."""
    w, v = np.linalg.eigh(cov)
    keep = w > max(float(w.max()), 0.0) * 1e-15
    root = np.zeros_like(w)
    root[keep] = 1.0 / np.sqrt(w[keep])
    return (v * root) @ v.T


def _svcca_weights(x: np.ndarray, y: np.ndarray, eps: float, weight_by: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Canonical correlations and projection weights in google/svcca's convention (module docstring).

    Returns (rho, weights, view) with `view` the weighting view, "x" or "y"."""
    (x_mean, y_mean), (xc, yc), (sxx, syy, sxy) = _centred_covariances(x, y)
    x_scale, y_scale = np.abs(sxx).max(), np.abs(syy).max()
    if x_scale == 0 or y_scale == 0:
        raise ValueError("a view is constant: CCA needs variance in both views")
    sxx, syy, sxy = sxx / x_scale, syy / y_scale, sxy / np.sqrt(x_scale * y_scale)
    # Dimensions whose variance is below eps of the largest carry nothing CCA can use: svcca drops them.
    kx, ky = np.diag(sxx) >= eps, np.diag(syy) >= eps
    sxx, syy, sxy = sxx[np.ix_(kx, kx)], syy[np.ix_(ky, ky)], sxy[np.ix_(kx, ky)]
    wx = _pinv_sqrt(sxx + eps * np.eye(len(sxx)))
    wy = _pinv_sqrt(syy + eps * np.eye(len(syy)))
    u, rho, vt = np.linalg.svd(wx @ sxy @ wy)
    rho = np.clip(rho, 0.0, 1.0)
    if weight_by == "smaller":
        weight_by = "x" if kx.sum() <= ky.sum() else "y"
    raw, centred, mean, rotation = ((x[:, kx], xc[:, kx], x_mean[kx], u) if weight_by == "x"
                                    else (y[:, ky], yc[:, ky], y_mean[ky], vt.T))
    # The directions keep the view's scale (no whitening) and get the column means back, one per direction.
    directions = centred @ rotation + mean
    q, _ = np.linalg.qr(directions)
    weights = np.abs(q.T @ raw).sum(axis=1)[: len(rho)]
    return rho, weights / weights.sum(), weight_by


def pwcca(x: np.ndarray, y: np.ndarray, eps: float = 1e-6, weight_by: str = "smaller",
          min_ratio: float = DEFAULT_MIN_RATIO, convention: str = "svcca") -> PWCCAResult:
    """Projection-weighted mean of the canonical correlations of x and y (Morcos et al., 2018).

    Each canonical direction i of the weighting view v gets weight alpha_i = sum_j |<h_i, v_j>|, where
    h_i are the view's canonical directions orthonormalised (QR) and v_j its columns: how much of the
    original dimensions the direction accounts for. The weights are normalised to sum to 1 and
    PWCCA = sum_i alpha_i rho_i. What h_i and v_j are, and what `eps` means, is the `convention`'s
    (module docstring).

    Args:
      x, y: views (n, d1) and (n, d2) over the same n words.
      eps: covariance ridge (and, for svcca, the variance below which a dimension is dropped).
      weight_by: "x", "y", or "smaller" (the narrower view, x on a tie: its k canonical directions span
        its whole space; this is the convention of svcca's `compute_pwcca`).
      min_ratio: n must be at least this many times max(d1, d2), else PipelineError (`check_sample_size`).
      convention: "svcca" (google/svcca's `compute_pwcca`) or "whitened" (the canonical variates).

    Returns:
      A `PWCCAResult`; `value` is 1 for views that are invertible linear maps of each other.
    """
    if weight_by not in WEIGHT_VIEWS:
        raise ValueError(f"weight_by must be one of {WEIGHT_VIEWS}; got {weight_by!r}")
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    x, y = _as_views(x, y)
    check_sample_size(x.shape[0], x.shape[1], y.shape[1], min_ratio)
    if convention == "svcca":
        if eps < 0:
            raise ValueError(f"eps must be >= 0; got {eps}")
        rho, weights, weight_by = _svcca_weights(x, y, eps, weight_by)
        return PWCCAResult(float(weights @ rho), weights, rho, weight_by, convention)
    result = cca(x, y, eps)
    if weight_by == "smaller":
        weight_by = "x" if x.shape[1] <= y.shape[1] else "y"
    view, variates = (x - result.x_mean, result.x_variates(x)) if weight_by == "x" else (y - result.y_mean, result.y_variates(y))
    q, _ = np.linalg.qr(variates)              # (n, k) orthonormal basis of the canonical variates
    weights = np.abs(q.T @ view).sum(axis=1)   # (k,) projection of every original dimension
    weights = weights / weights.sum()
    return PWCCAResult(float(weights @ result.rho), weights, result.rho, weight_by, convention)


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
             weight_by: str = "smaller", min_ratio: float = DEFAULT_MIN_RATIO,
             convention: str = "svcca") -> dict[tuple[str, str], PWCCAResult]:
    """PWCCA of every (a, b) in `pairs` between the named views (all over the same words)."""
    out = {}
    for a, b in pairs:
        for name in (a, b):
            if name not in views:
                raise PipelineError(f"unknown PWCCA system {name!r}; available: {', '.join(views)}")
        out[(a, b)] = pwcca(views[a], views[b], eps=eps, weight_by=weight_by, min_ratio=min_ratio, convention=convention)
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


def table2_rows(results: Mapping[tuple[str, str], PWCCAResult], views: Mapping[str, np.ndarray], n_shared: int,
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
