"""The representation probe of the mechanism study (../shared/MECHANISM.md): can a linear readout of an
encoder's state of an object word tell the object's attribute, for objects it was not fitted on?

Pure numpy, float64. One object is one row: its features (a layer's state of the object word, averaged
over neutral sentences) and its class (the attribute). The readout is ridge regression on one-hot
classes with an unpenalized intercept, on features standardized over the objects, and it is scored
leave-one-object-out. Ridge is a linear smoother, y_hat = H y with H fixed by the features alone, so
every left-out prediction comes from H in closed form, and another assignment of the classes only changes
y: the 1,000 assignments of the null cost one matrix product.

The null (issue 68) is the fact table re-drawn by `world.draw_facts` with other seeds, each probed object's
attribute under the re-draw its class (`redrawn_classes`): the distribution the real table was drawn from. It
keeps the real table's balance within the strata the corpus expresses (old or new, size, what can be built),
which a free shuffle of the classes over the objects loses, and that balance biases the left-out probe: an
object's class is one short among its stratum's fitted objects, so a readout of the strata predicts against it.
On features that tell the strata apart and nothing else the real table scores 0.00, a shuffled null 0.17 and
the re-drawn null 0.03 (a re-draw is balanced over all 80 objects, the real table also over its own 72
captioned ones, 18 of each attribute, so the probed objects' real table stays a little more even than a re-draw);
on the study's fact-free features (corpus counts, the baseline encoder) the two nulls' means differ by under
0.01, and both hold p < 0.05 near 5% of facts seeds. `selectivity`, accuracy minus the null's mean, is what
the probe reads beyond the strata (Hewitt and Liang 2019: a probe is read against a control task).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

# The re-drawn tables' seeds: NULL_SEEDS_FROM, NULL_SEEDS_FROM + 1, ... One block for every study, so the study
# (facts seed 0), its replication (1) and the de-risk (100) are read against the same draws; it holds no seed
# any model of the project was trained on (0, 1, 100, the bag-of-words row's 0-4), though only the study's own
# seed would be wrong in its null (its table would be the observed one): `redrawn_classes` refuses it.
NULL_SEEDS_FROM = 10_000


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


def null_seeds(n: int) -> list[int]:
    """The seeds of the null's `n` re-drawn fact tables."""
    return list(range(NULL_SEEDS_FROM, NULL_SEEDS_FROM + n))


def redrawn_classes(table: Callable[[int], Mapping[str, str]], words: Sequence[str], attributes: Sequence[str],
                    seeds: Sequence[int], own_seed: int) -> np.ndarray:
    """The null's classes (len(seeds), objects) int: each probed object's (`words`) attribute in the fact table
    `table(seed)` (object -> attribute: `MechanismSettings.facts(seed).real`) drawn with each of `seeds`.

    About a second for 1,000 tables on the embedded world, and they do not depend on the model: draw them once
    per study and pass them to every probe. The study's own seed would put its real table in its null: refused."""
    if own_seed in seeds:
        raise ValueError(f"the probe's null re-draws the facts with other seeds than the study's own ({own_seed})")
    return np.array([[attributes.index(facts[w]) for w in words] for facts in map(table, seeds)], dtype=int)


def null_accuracies(features: np.ndarray, null_classes: np.ndarray, n_classes: int, lam: float) -> np.ndarray:
    """Left-out accuracies (draws,) of the probe on each row of `null_classes` (draws, objects): one hat matrix
    and one matrix product for them all."""
    null_classes = np.asarray(null_classes)
    scores = loo_predictions(hat_matrix(features, lam), onehot(null_classes, n_classes))
    return (scores.argmax(-1) == null_classes).mean(-1)


def p_above(observed: float, null: np.ndarray) -> float:
    """One-sided permutation p-value, counting the observed draw: (1 + #null >= observed) / (1 + n)."""
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + len(null)))


def sign_flip_p(a: np.ndarray, b: np.ndarray, n_flip: int, seed: int) -> float:
    """Paired one-sided test that `a` beats `b` (per-object scores): the mean difference against random
    sign flips of each object's difference."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_flip, len(d)))
    return p_above(float(d.mean()), (signs * d).mean(-1))
