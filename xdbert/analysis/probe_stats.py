"""What the visual-knowledge probes' figures are read against (../shared/PROBES.md): the majority line and the class
prior beside each column, on the items that column scores; CoDa's per-object correlations; the paired bootstrap over
subjects that compares two rows. The figures themselves: xdbert.analysis.vicomte_probe.

Unseen classes, the rule: the linear probe leaves out a test subject whose class never occurs in train (the
classifier has no column for it; eval_classification.py scores over the classes seen in training), the cloze keeps
every test subject (a class word is in the vocabulary whether or not train holds it; eval_zero_shot.py divides by the
whole test split). So the two kinds of column score different items wherever test holds a class train lacks (the
real shape files: `polygon`, one item), and each column's line is computed on that column's own items. A class no
subject has (`semicircle`, `jade`) is still a class: a count column the cloze ranks and the class prior gives zero.

No params or paths; numpy and scipy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from xdbert.analysis.mechanism_stats import Interval, bootstrap_replicates, percentile_interval
from xdbert.analysis.vicomte_probe import finite_mean, kendall_rows, spearman_rows

BOOTSTRAP_SUBJECTS = "paired bootstrap: subjects"
PROBE_KINDS = ("linear", "zero_shot")  # the linear probe's columns, the cloze's


# ----------------------------------------------------------------------------------------------------
# The lines beside the columns
# ----------------------------------------------------------------------------------------------------

def majority_class(labels: np.ndarray) -> tuple[int, float]:
    """The most frequent class of a split and its share: the accuracy of always guessing it (the lowest
    index on ties). PROBES.md's majority lines are the test split's own (colour all groups: white, 37.5%)."""
    labels = np.asarray(labels)
    if not len(labels):
        raise ValueError("the majority class of an empty split is undefined")
    classes, counts = np.unique(labels, return_counts=True)
    return int(classes[np.argmax(counts)]), float(counts.max() / len(labels))


def prior_spearman(train_y: np.ndarray, test_y: np.ndarray, test_dist: np.ndarray) -> np.ndarray:
    """The linear Spearman columns' line: every test subject scored by the train class counts, a classifier that
    learned the prior alone, compared as `vicomte_probe.fit_and_score` compares (classes seen in train, subjects of
    unseen classes left out). (n_test,) with NaN where left out."""
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    test_dist = np.asarray(test_dist, dtype=np.float64)
    seen, counts = np.unique(train_y, return_counts=True)
    kept = np.isin(test_y, seen)
    out = np.full(len(test_y), np.nan)
    if kept.any():
        out[kept] = spearman_rows(test_dist[kept][:, seen], np.tile(counts, (int(kept.sum()), 1)))
    return out


def scored_items(kind: str, train_y: np.ndarray, test_y: np.ndarray) -> np.ndarray:
    """Which test subjects a kind of column scores (the module's rule): the linear probe's, those whose class train
    holds; the cloze's, all."""
    if kind not in PROBE_KINDS:
        raise ValueError(f"unknown kind of column {kind!r}; allowed: {', '.join(PROBE_KINDS)}")
    test_y = np.asarray(test_y)
    return np.isin(test_y, np.asarray(train_y)) if kind == "linear" else np.ones(len(test_y), dtype=bool)


def majority_line(kind: str, train_y: np.ndarray, test_y: np.ndarray, test_dist: np.ndarray) -> dict:
    """The line beside a kind of column ("linear" or "zero_shot"), on the items it scores (`scored_items`):
    {"class": the majority class among them (an index), "accuracy": its share, "n": how many, "prior_spearman": the
    class prior's mean Spearman}. The linear probe's prior is `prior_spearman` (classes seen in train); the cloze's
    ranks every class, so its prior does too, the train counts with zero for a class train lacks."""
    test_y, test_dist = np.asarray(test_y), np.asarray(test_dist, dtype=np.float64)
    kept = scored_items(kind, train_y, test_y)
    cls, share = majority_class(test_y[kept])
    if kind == "linear":
        prior = prior_spearman(train_y, test_y, test_dist)
    else:
        counts = np.bincount(np.asarray(train_y), minlength=test_dist.shape[1]).astype(np.float64)
        prior = spearman_rows(test_dist, np.tile(counts, (len(test_y), 1)))
    return {"class": cls, "accuracy": share, "n": int(kept.sum()), "prior_spearman": finite_mean(prior)}


# ----------------------------------------------------------------------------------------------------
# CoDa
# ----------------------------------------------------------------------------------------------------

def coda_correlations(scores: Sequence[np.ndarray], human: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CoDa's per-object Spearman and Kendall (tau-b) of a row's class scores against the human colour
    distribution. `scores[i]` (templates_i, classes) are object i's scores under each of its templates
    (CoDa's objects groups have their own templates), `human` (objects, classes). Each figure is the best
    template's per object (max over templates, each metric on its own): an upper bound, as the zero-shot
    evaluation of CoDa picks each object's best template. NaN where every template's rho is undefined."""
    human = np.asarray(human, dtype=np.float64)
    if len(scores) != len(human):
        raise ValueError(f"CoDa needs one score array per object; got {len(scores)} for {len(human)} objects")
    rho, tau = np.full(len(human), np.nan), np.full(len(human), np.nan)
    for i, (s, h) in enumerate(zip(scores, human)):
        s = np.atleast_2d(np.asarray(s, dtype=np.float64))
        if s.shape[1] != len(h):
            raise ValueError(f"object {i}: {s.shape[1]} class scores for {len(h)} classes")
        r = spearman_rows(np.tile(h, (len(s), 1)), s)
        k = kendall_rows(np.tile(h, (len(s), 1)), s)
        rho[i] = np.nanmax(r) if np.isfinite(r).any() else np.nan
        tau[i] = np.nanmax(k) if np.isfinite(k).any() else np.nan
    return rho, tau


# ----------------------------------------------------------------------------------------------------
# The paired bootstrap
# ----------------------------------------------------------------------------------------------------

def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n_boot: int, level: float, seed: int) -> Interval:
    """Row a's mean minus row b's over the same subjects, with a percentile interval at `level` from
    `n_boot` paired resamples: each draws subjects with replacement and takes both rows' means over the
    same draw (mechanism_stats.bootstrap_replicates, one unit per subject). `a` and `b` (subjects,) are
    per-subject results (`Scores.correct` or `.spearman`); both must leave out the same subjects (NaN)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a paired difference needs two rows on the same subjects; got {a.shape} and {b.shape}")
    kept = np.isfinite(a)
    if not np.array_equal(kept, np.isfinite(b)):
        raise ValueError("the two rows leave out different subjects; a paired difference needs the same ones")
    if kept.sum() < 2:
        raise ValueError(f"a bootstrap needs at least 2 subjects; got {int(kept.sum())}")
    a, b = a[kept], b[kept]
    ones = np.ones(len(a))
    replicates = (bootstrap_replicates(a[None], ones, n_boot, seed)
                  - bootstrap_replicates(b[None], ones, n_boot, seed))
    return Interval(float(a.mean() - b.mean()), *percentile_interval(replicates, level), BOOTSTRAP_SUBJECTS)
