"""A job's results: per-seed metrics, medians over seeds and per-example predictions, written atomically."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from xdbert import io, paths
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.job import Job


def _clean(x: float) -> float | None:
    """NaN (e.g. Spearman of a constant prediction) becomes null in JSON, not an invalid token."""
    return None if x is None or not math.isfinite(x) else float(x)


def summarize(job: Job, runs: list[dict]) -> dict:
    """Per-seed metrics and the median over seeds of every dev metric; headline = `median[first split][metric]`."""
    spec = job.spec
    median = {}
    for split in spec.dev_splits:
        names = runs[0]["metrics"][split].keys()
        median[split] = {m: _clean(float(np.median([r["metrics"][split][m] for r in runs]))) for m in names}
    per_seed = {str(r["seed"]): {
        **{split: {m: _clean(v) for m, v in r["metrics"][split].items()} for split in spec.dev_splits},
        **{k: _clean(r[k]) for k in ("first_epoch_loss", "last_epoch_loss")},
        "steps": r["steps"], "device": r["device"],
        "precision": r["precision"],
        **({"stacked_with": r["stacked_with"]} if "stacked_with" in r else {}),  # its dropout's stack
    } for r in runs}  # wall-clock times go to the run log (xdbert.runlog)
    return {
        "task": spec.name, "kind": job.model_kind, "metric": spec.metric, "higher_is_better": spec.higher_is_better,
        "headline": median[spec.dev_splits[0]][spec.metric], "median": median, "seeds": per_seed,
        "n_seeds": len(runs),
    }


def predictions_table(job: Job, runs: list[dict]) -> pa.Table:
    """One row per (seed, dev split, example): seed, split, idx, prediction, label, correct.

    `correct` is null for regression, where no single prediction is right or wrong.
    """
    regression = job.spec.kind == "regression"
    cols: dict[str, list] = {k: [] for k in ("seed", "split", "idx", "prediction", "label", "correct")}
    for r in runs:
        for split in job.dev_splits:
            data, pred = job.data[split], np.asarray(r["predictions"][split])
            if pred.shape != (len(data),):
                raise PipelineError(f"seed {r['seed']} {split}: {pred.shape[0] if pred.ndim else 0} predictions for {len(data)} examples")
            cols["seed"].append(np.full(len(data), r["seed"], dtype=np.int64))
            cols["split"].append(np.full(len(data), split, dtype=object))
            cols["idx"].append(data.idx)
            cols["prediction"].append(pred.astype(np.float64 if regression else np.int64))
            cols["label"].append(data.labels.astype(np.float64 if regression else np.int64))
            cols["correct"].append(np.full(len(data), None, dtype=object) if regression else pred == data.labels)
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    schema = pa.schema([("seed", pa.int64()), ("split", pa.string()), ("idx", pa.int64()),
                        ("prediction", pa.float64() if regression else pa.int64()),
                        ("label", pa.float64() if regression else pa.int64()), ("correct", pa.bool_())])
    return pa.table({k: pa.array(arrays[k], type=schema.field(k).type) for k in schema.names}, schema=schema)


def write_results(out_dir: str | Path, job: Job, runs: list[dict], info: dict[str, Any]) -> dict:
    """Write metrics.json and predictions.parquet into `out_dir`, as one atomic directory."""
    table = predictions_table(job, runs)  # checks the prediction lengths before anything is written
    metrics = {**info, **summarize(job, runs),
               "hyperparameters": {**dataclasses.asdict(job.hyperparameters), "model_size": job.size}}
    with io.atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        io.write_json(tmp / "metrics.json", metrics)
        io.write_parquet(table, tmp / paths.PREDICTIONS)
    return metrics
