"""Task metrics, computed with scikit-learn and scipy (never by hand).

Headline metrics are the ones the paper's tables report: RTE/SST-2/QNLI/MNLI/QQP/SWAG accuracy,
MRPC F1 (positive class = equivalent), STS-B Spearman, CoLA Matthews correlation, READ RMSE (lower is
better). MNLI is scored once per dev split: call `compute_metrics("mnli", ...)` for matched and for
mismatched. Pearson/Spearman of a constant prediction are undefined and come back as NaN (scipy's
answer), not as a made-up number: a collapsed run should be visible in the report.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
from scipy.stats import pearsonr, rankdata, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

from xdbert.errors import PipelineError
from xdbert.data.tasks.registry import TaskSpec, get_task


def _as_array(x: Sequence | np.ndarray, what: str, task: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise PipelineError(f"{task}: {what} must be numbers ({e})") from e
    if arr.size == 0:
        raise PipelineError(f"{task}: {what} are empty")
    if np.isnan(arr).any():
        raise PipelineError(f"{task}: {what} contain NaN")
    return arr


def predicted_labels(spec: TaskSpec, predictions: Sequence | np.ndarray, n: int) -> np.ndarray:
    """Class indices (classification, multiple choice) or scores (regression) of shape (n,).

    Accepts indices/scores of shape (n,), logits of shape (n, num_labels) (argmax), and for
    regression scores of shape (n, 1).
    """
    pred = _as_array(predictions, "predictions", spec.name)
    width = spec.num_labels
    if pred.ndim == 2 and pred.shape[1] == width and (spec.kind != "regression" or width == 1):
        pred = pred[:, 0] if spec.kind == "regression" else pred.argmax(axis=1)
    if pred.ndim != 1 or pred.shape[0] != n:
        allowed = f"({n},) or ({n}, {width})"
        raise PipelineError(f"{spec.name}: predictions have shape {tuple(pred.shape)}; expected {allowed} for {n} labels")
    if spec.kind != "regression":
        if not np.all(pred == np.round(pred)) or pred.min() < 0 or pred.max() >= width:
            raise PipelineError(f"{spec.name}: predicted classes must be integers in 0..{width - 1}")
        pred = pred.astype(np.int64)
    return pred


def compute_metrics(task: str, predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray,
                    names: Sequence[str] | None = None) -> dict[str, float]:
    """Every metric of `task` (`TaskSpec.metrics`, headline first), or only `names`, for one dev split."""
    spec = get_task(task)
    names = spec.metrics if names is None else names
    if unknown := [n for n in names if n not in spec.metrics]:
        raise PipelineError(f"{task} has no metric {', '.join(unknown)}; it reports {', '.join(spec.metrics)}")
    y = _as_array(labels, "labels", task)
    if y.ndim != 1:
        raise PipelineError(f"{task}: labels must be 1-D; got shape {tuple(y.shape)}")
    if spec.kind != "regression":
        if not np.all(y == np.round(y)) or y.min() < 0 or y.max() >= spec.num_labels:
            raise PipelineError(f"{task}: labels must be class indices in 0..{spec.num_labels - 1} (test splits with label -1 cannot be scored)")
        y = y.astype(np.int64)
    p = predicted_labels(spec, predictions, len(y))

    out: dict[str, float] = {}
    with warnings.catch_warnings():
        # constant inputs: scipy warns and returns NaN, which is the honest value here
        warnings.simplefilter("ignore")
        for name in names:
            if name == "accuracy":
                out[name] = float(accuracy_score(y, p))
            elif name == "f1":
                out[name] = float(f1_score(y, p, pos_label=1, average="binary", zero_division=0.0))
            elif name == "matthews":
                out[name] = float(matthews_corrcoef(y, p))
            elif name == "pearson":
                out[name] = float(pearsonr(p, y)[0]) if len(y) > 1 else float("nan")
            elif name == "spearman":
                out[name] = float(spearmanr(p, y)[0]) if len(y) > 1 else float("nan")
            elif name == "rmse":
                out[name] = float(np.sqrt(mean_squared_error(y, p)))
            else:  # a TaskSpec names a metric this module does not know: a programming error
                raise ValueError(f"unknown metric {name}")
    return out


def resampled_metric(task: str, name: str, predictions: np.ndarray, labels: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """Metric `name` of `task` on many resamples at once: `samples` (k, n) indexes the n examples.

    Row i equals `compute_metrics(task, predictions[samples[i]], labels[samples[i]], [name])[name]`
    (tests check it), computed in a few library calls over all rows: the bootstrap needs tens of
    thousands of these, and one scikit-learn call per row spent ~4 ms checking its inputs (137 of the
    aggregate stage's CPU-seconds). Accuracy is the row mean of matches. `predictions` and `labels`
    must already be valid (`compute_metrics` checks them).
    """
    spec = get_task(task)
    p, y = np.asarray(predictions)[samples], np.asarray(labels)[samples]  # (k, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant rows: NaN, as compute_metrics
        if name == "accuracy":
            return (p == y).mean(axis=1)
        if name == "f1":
            # each resample as one label of a multilabel problem: scikit-learn scores the columns separately.
            # A lone column would read as a binary problem (F1 of both classes), so it is scored twice.
            pp, yy = (np.vstack([p, p]), np.vstack([y, y])) if len(p) == 1 else (p, y)
            return f1_score(yy.T.astype(np.int64), pp.T.astype(np.int64), average=None, zero_division=0.0)[:len(p)]
        if name == "matthews":
            if spec.num_labels != 2:
                raise ValueError(f"{task}: resampled Matthews correlation is implemented for two classes")
            # for two classes MCC is the Pearson correlation of the 0/1 vectors; scikit-learn gives 0 where
            # either is constant (scipy: NaN)
            return np.nan_to_num(pearsonr(p.astype(float), y.astype(float), axis=1)[0], nan=0.0)
        if name == "pearson":
            return pearsonr(p, y, axis=1)[0]
        if name == "spearman":  # Pearson of the tie-averaged ranks, as spearmanr
            return pearsonr(rankdata(p, axis=1), rankdata(y, axis=1), axis=1)[0]
        if name == "rmse":
            return np.sqrt(mean_squared_error(y.T, p.T, multioutput="raw_values"))
    raise ValueError(f"unknown metric {name}")
