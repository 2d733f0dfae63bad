"""The representation probe of the mechanism study (../shared/MECHANISM.md): can a linear readout of an
encoder's state of an object word tell the object's attribute, for objects it was not fitted on?

Pure numpy, float64. One object is one row: its features (a layer's state of the object word, averaged
over neutral sentences) and its class (the attribute). The readout is ridge regression on one-hot
classes with an unpenalized intercept, on features standardized over the objects, and it is scored
leave-one-object-out. Ridge is a linear smoother, y_hat = H y with H fixed by the features alone, so
every left-out prediction comes from H in closed form, and a permutation of the classes only permutes
y: the 1,000 permutations of the null cost one matrix product.
"""
from __future__ import annotations

import numpy as np


def hat_matrix(features: np.ndarray, lam: float) -> np.ndarray:
    """H (n, n) of ridge with an unpenalized intercept on standardized `features` (n, d).

    Standardizing uses every row's features but no class, so no class of a left-out object leaks into
    its own prediction. Columns that do not vary over the objects carry nothing and are dropped.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or len(x) < 3:
        raise ValueError(f"the probe needs features of shape (objects >= 3, width); got {x.shape}")
    if lam <= 0:
        raise ValueError(f"the ridge penalty must be above 0; got {lam}")
    std = x.std(0)
    x = (x[:, std > 1e-12] - x.mean(0)[std > 1e-12]) / std[std > 1e-12]
    n = len(x)
    gram = x @ x.T  # the kernel form: n objects are fewer than the width
    return np.full((n, n), 1.0 / n) + gram @ np.linalg.inv(gram + lam * np.eye(n))


def loo_predictions(h: np.ndarray, onehot: np.ndarray) -> np.ndarray:
    """Left-out scores (..., n, k) for one-hot classes (..., n, k): (y_hat_i - H_ii y_i) / (1 - H_ii)."""
    d = np.diag(h)[:, None]
    return (h @ onehot - d * onehot) / (1.0 - d)


def onehot(classes: np.ndarray, n_classes: int) -> np.ndarray:
    return np.eye(n_classes)[np.asarray(classes)]


def loo_correct(features: np.ndarray, classes: np.ndarray, n_classes: int, lam: float) -> np.ndarray:
    """Per object, whether its left-out prediction is its class (n,) bool."""
    scores = loo_predictions(hat_matrix(features, lam), onehot(classes, n_classes))
    return scores.argmax(-1) == np.asarray(classes)


def permutation_null(features: np.ndarray, classes: np.ndarray, n_classes: int, lam: float, n_perm: int,
                     seed: int) -> np.ndarray:
    """Left-out accuracies (n_perm,) with the classes shuffled over the objects (each class keeps its count)."""
    classes = np.asarray(classes)
    rng = np.random.default_rng(seed)
    shuffled = np.stack([rng.permutation(classes) for _ in range(n_perm)])
    scores = loo_predictions(hat_matrix(features, lam), onehot(shuffled, n_classes))
    return (scores.argmax(-1) == shuffled).mean(-1)


def p_above(observed: float, null: np.ndarray) -> float:
    """One-sided permutation p-value, counting the observed draw: (1 + #null >= observed) / (1 + n)."""
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + len(null)))


def sign_flip_p(a: np.ndarray, b: np.ndarray, n_flip: int, seed: int) -> float:
    """Paired one-sided test that `a` beats `b` (per-object scores): the mean difference against random
    sign flips of each object's difference."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_flip, len(d)))
    return p_above(float(d.mean()), (signs * d).mean(-1))
