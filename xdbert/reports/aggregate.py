"""Seed statistics for the result tables: median, spread, and a paired bootstrap against the baseline.

Everything is recomputed from the per-example dev predictions that each finetune run writes, so a
table cell and its confidence interval come from the same numbers and the same metric code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from xdbert.data.tasks.metrics import compute_metrics, resampled_metric
from xdbert.data.tasks.registry import TaskSpec
from xdbert.errors import PipelineError
from xdbert.finetuning.control.predictions import RERUN


@dataclass
class Cell:
    """One (model, task) result: the headline metric per seed and its summary."""

    task: TaskSpec
    split: str
    per_seed: dict[int, float]
    all_metrics: dict[str, float]  # median over seeds of every metric the task reports

    @property
    def median(self) -> float:
        return float(np.median(list(self.per_seed.values())))

    @property
    def spread(self) -> tuple[float, float]:
        v = list(self.per_seed.values())
        return float(np.min(v)), float(np.max(v))


def cell(preds: pd.DataFrame, task: TaskSpec, split: str | None = None) -> Cell:
    """The task's metrics per seed on `split`; by default the headline split, the one a table column shows
    (MNLI: matched; mismatched is reported beside)."""
    split = split or task.dev_splits[0]
    rows = preds[preds["split"] == split]
    if rows.empty:
        raise PipelineError(f"{preds.attrs.get('source', 'the predictions')} has none of {task.name}'s split {split}; {RERUN}")
    per_seed, metrics = {}, []
    for seed, g in rows.groupby("seed"):
        g = g.sort_values("idx")
        m = compute_metrics(task.name, g["prediction"].to_numpy(), g["label"].to_numpy())
        per_seed[int(seed)] = float(m[task.metric])
        metrics.append(m)
    medians = {k: float(np.median([m[k] for m in metrics])) for k in metrics[0]}
    return Cell(task, split, per_seed, medians)


@dataclass
class Replicates:
    """One model's headline metric (median over seeds) on the whole dev split and on each resample."""

    task: TaskSpec
    idx: pd.Index             # dev example ids, sorted
    point: float
    resampled: np.ndarray     # (n_boot,)
    source: str               # the predictions file, for errors


def bootstrap_replicates(preds: pd.DataFrame, task: TaskSpec, n_boot: int, seed: int = 0) -> Replicates:
    """The median-over-seeds metric on `n_boot` resamples of the dev examples drawn from `seed`.

    Every model of a task is resampled with the same seed over the same sorted examples, so two
    models' replicates are paired: a table computes each model's replicates once and compares any two.
    """
    rows = preds[preds["split"] == task.dev_splits[0]]
    table = rows.pivot(index="idx", columns="seed", values="prediction").sort_index()
    labels = rows.drop_duplicates("idx").set_index("idx").sort_index()["label"].to_numpy()
    columns = [table[s].to_numpy() for s in table.columns]
    point = float(np.median([compute_metrics(task.name, pred, labels, [task.metric])[task.metric] for pred in columns]))
    n = len(labels)
    samples = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    resampled = np.median([resampled_metric(task.name, task.metric, pred, labels, samples) for pred in columns], axis=0)
    return Replicates(task, table.index, point, resampled, preds.attrs.get("source", "predictions"))


def compare(ours: Replicates, base: Replicates) -> dict:
    """95% paired-bootstrap interval of ours - base (see `bootstrap_replicates`)."""
    if not ours.idx.equals(base.idx) or len(ours.resampled) != len(base.resampled):
        raise PipelineError(f"{ours.task.name}: {ours.source} and {base.source} cover different dev examples; rerun "
                            "the finetune stage (`dvc repro`)")
    diffs = ours.resampled - base.resampled
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    delta = ours.point - base.point
    better = delta > 0 if ours.task.higher_is_better else delta < 0
    return {"delta": delta, "ci_low": float(lo), "ci_high": float(hi), "n_boot": len(diffs),
            "significant": bool(lo > 0 or hi < 0), "ours_better": bool(better)}

