"""A run's per-example dev predictions as the tables and analyses read them back (`results` writes them).

A module apart from `results`, which imports the run's `Job` and with it everything a run computes: what reads
predictions depends on their file, not on how they were computed.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from xdbert import io
from xdbert.errors import PipelineError

RERUN = "rerun its finetune stage (`dvc repro`)"


def read_predictions(path: Path) -> pd.DataFrame:
    """A run's dev predictions (`results.write_results`), checked as every table and figure needs them:
    each example once per seed and split, and every seed of a split on the same examples, which the paired
    bootstrap and Figure 4's per-example comparison assume. `attrs["source"]` names the file in errors."""
    preds = io.read_parquet(path, RERUN).to_pandas()
    missing = sorted({"seed", "split", "idx", "prediction", "label", "correct"} - set(preds.columns))
    if missing:
        raise PipelineError(f"{path} lacks columns {missing}; {RERUN}")
    if preds.duplicated(["split", "seed", "idx"]).any():
        raise PipelineError(f"{path} has an example twice for one seed; {RERUN}")
    examples = preds.groupby(["split", "seed"])["idx"].agg(frozenset).groupby(level="split").nunique()
    uneven = sorted(examples.index[examples > 1])
    if uneven:
        raise PipelineError(f"{path}: its seeds cover different dev examples of {', '.join(uneven)}; {RERUN}")
    preds.attrs["source"] = str(path)
    return preds
