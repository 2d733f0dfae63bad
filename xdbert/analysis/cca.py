"""Canonical correlation analysis and projection-weighted CCA (PWCCA) of two sets of vectors.

Paper Table 2 compares the word-embedding matrices of BERT, ELECTRA, CLIP's text tower and uniform
noise over the words the vocabularies share. Each embedding matrix is one "view" of the same words:
rows are words (data points), columns are embedding dimensions ("neurons" in the SVCCA papers).

CCA finds directions a_i, b_i such that the projections x a_i and y b_i are maximally correlated, with
each new pair uncorrelated to the previous ones; the correlations rho_1 >= rho_2 >= ... are the
canonical correlations. PWCCA (Morcos, Raghu and Bengio, 2018) summarises them as a weighted mean in
which a canonical direction counts as much as it accounts for the original dimensions of one view,
so directions that merely fit noise in a few dimensions count little.

Two conventions for the weights (`convention`); the canonical correlations are the same:
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

Numpy only, like svcca's `cca_core.py`: no params and no paths. Bad input raises ValueError;
xdbert/analysis/pwcca.py, which reads the `pwcca` params, names the param in the message the user gets.

Written for this project from the papers and google/svcca's documented behaviour (its code was not copied).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WEIGHT_VIEWS = ("x", "y", "smaller")
CONVENTIONS = ("svcca", "whitened")
DEFAULT_MIN_RATIO = 5.0


class TooFewPoints(ValueError):
    """Too few data points for the views' widths: CCA would find high correlations between any two views."""


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
    many free directions as data points), so the numbers would say nothing. Raises TooFewPoints.
    """
    need = int(np.ceil(min_ratio * max(d1, d2)))
    if n_words < need:
        raise TooFewPoints(f"PWCCA over {n_words} shared words is not meaningful for embedding widths {d1} and {d2}: "
                           f"it needs at least {min_ratio:g}x the larger width, i.e. {need} words")


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
      min_ratio: n must be at least this many times max(d1, d2), else TooFewPoints (`check_sample_size`).
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

