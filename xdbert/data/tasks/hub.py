"""The real tasks (paper profile): GLUE, SWAG and CommonLit readability mapped to the normalized schema.

Everything goes through `datasets.load_dataset`, so a hub id and a local folder in the hub's layout
(`<dir>/<config>/<split>-00000-of-00001.parquet` plus the README.md `configs:` block) load the same
way; the tests point these loaders at such folders.

- GLUE (`nyu-mll/glue`): the `train` and `validation` splits (MNLI: `validation_matched`,
  `validation_mismatched`) with GLUE's own label order. Test splits carry label -1 and are never used.
- SWAG (`allenai/swag`, config `regular`): text_a = `sent1`, text_b = `sent2` (the first words of the
  next sentence, which every ending completes), choices = `ending0..3`; idx = row number.
- READ (Kaggle `commonlitreadabilityprize`): only `train.csv` has public labels, so its rows are split
  deterministically: a seeded permutation puts `dev_fraction` of them (10% by default) into `dev`;
  text_a = `excerpt`, label = `target`, idx = the row number in train.csv.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from xdbert.data.provided import READ_COLUMNS, check_read_csv
from xdbert.errors import PipelineError
from xdbert.hub import hub_config_errors, hub_request, source
from xdbert.data.tasks.registry import TaskSpec, get_task, to_table

# task -> (GLUE config, first text column, second text column or None)
GLUE = {
    "rte": ("rte", "sentence1", "sentence2"),
    "mrpc": ("mrpc", "sentence1", "sentence2"),
    "stsb": ("stsb", "sentence1", "sentence2"),
    "cola": ("cola", "sentence", None),
    "sst2": ("sst2", "sentence", None),
    "qnli": ("qnli", "question", "sentence"),
    "qqp": ("qqp", "question1", "question2"),
    "mnli": ("mnli", "premise", "hypothesis"),
}
# our split -> the hub's
HUB_SPLITS = {"train": "train", "dev": "validation",
              "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched"}
SWAG_CONFIG = "regular"


def _load(hub_id: str, config: str | None, what: str, section: str, cache_dir: str | None):
    import datasets

    with hub_config_errors(section, hub_id, config), hub_request(what):
        return datasets.load_dataset(source(hub_id, "dataset"), config, cache_dir=cache_dir)


def _frame(ds, split: str, columns: list[str], what: str) -> pd.DataFrame:
    if split not in ds:
        raise PipelineError(f"{what} has no split `{split}`; it has: {', '.join(ds)}")
    missing = [c for c in columns if c not in ds[split].column_names]
    if missing:
        raise PipelineError(f"{what} split `{split}` lacks columns {missing}; it has: {', '.join(ds[split].column_names)}")
    return ds[split].to_pandas()[columns]


def _labels(spec: TaskSpec, values: pd.Series) -> list:
    if spec.kind == "regression":
        # the hub stores STS-B scores as float32; rounding recovers the published decimals (3.8, not 3.7999999)
        return [round(float(v), 5) for v in values]
    return [int(v) for v in values]


def load_glue(task: str, hub_id: str = "nyu-mll/glue", cache_dir: str | None = None) -> dict[str, pa.Table]:
    """One GLUE task in the normalized schema: train and its dev split(s)."""
    spec = get_task(task)
    if task not in GLUE:
        raise PipelineError(f"{task} is not a GLUE task; GLUE tasks: {', '.join(GLUE)}")
    config, col_a, col_b = GLUE[task]
    what = f"GLUE {config} (`{hub_id}`)"
    ds = _load(hub_id, config, what, "tasks.glue_hub_id", cache_dir)
    out = {}
    for split in spec.splits:
        cols = ["idx", col_a] + ([col_b] if col_b else []) + ["label"]
        df = _frame(ds, HUB_SPLITS[split], cols, what)
        df = df[df["label"] != -1]  # unlabeled rows (GLUE test splits) cannot be trained or scored
        if df.empty:
            raise PipelineError(f"{what} split `{HUB_SPLITS[split]}` has no labeled rows")
        out[split] = to_table(spec, {
            "idx": [int(i) for i in df["idx"]],
            "text_a": df[col_a].tolist(),
            "text_b": df[col_b].tolist() if col_b else [None] * len(df),
            "choices": [None] * len(df),
            "label": _labels(spec, df["label"]),
        })
    return out


def load_swag(hub_id: str = "allenai/swag", cache_dir: str | None = None) -> dict[str, pa.Table]:
    """SWAG (`regular` config) in the normalized schema: train and dev (the hub's validation)."""
    spec = get_task("swag")
    what = f"SWAG (`{hub_id}`, {SWAG_CONFIG})"
    ds = _load(hub_id, SWAG_CONFIG, what, "tasks.swag_hub_id", cache_dir)
    endings = [f"ending{i}" for i in range(4)]
    out = {}
    for split in spec.splits:
        df = _frame(ds, HUB_SPLITS[split], ["sent1", "sent2", *endings, "label"], what)
        df = df[df["label"] != -1]
        out[split] = to_table(spec, {
            "idx": [int(i) for i in df.index],  # the row number in the hub's split
            "text_a": df["sent1"].tolist(),
            "text_b": df["sent2"].tolist(),
            "choices": df[endings].values.tolist(),
            "label": [int(v) for v in df["label"]],
        })
    return out


def _read_frame(path_or_id: str, cache_dir: str | None) -> pd.DataFrame:
    path = Path(path_or_id)
    if path.suffix == ".csv":
        check_read_csv(path)
        return pd.read_csv(path, keep_default_na=False)
    what = f"CommonLit readability (`{path_or_id}`)"
    ds = _load(path_or_id, None, what, "tasks.read_path", cache_dir)
    split = "train" if "train" in ds else next(iter(ds))
    return ds[split].to_pandas()


def split_read(n: int, dev_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers of train and dev: a seeded permutation, `ceil(n * dev_fraction)` rows to dev, each sorted."""
    if not 0 < dev_fraction < 1:
        raise PipelineError(f"`tasks.read_dev_fraction` must be between 0 and 1 (exclusive); got {dev_fraction!r}")
    n_dev = math.ceil(n * dev_fraction)
    if n_dev >= n:
        raise PipelineError(f"CommonLit data has {n} rows: too few to hold out a dev split")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_dev:]), np.sort(perm[:n_dev])


def load_read(path_or_id: str, dev_fraction: float = 0.1, seed: int = 0, cache_dir: str | None = None) -> dict[str, pa.Table]:
    """CommonLit readability from a local Kaggle `train.csv` or a hub id, split into train/dev."""
    if not isinstance(path_or_id, str) or not path_or_id.strip():
        raise PipelineError("`tasks.read_path` is empty: give the Kaggle commonlitreadabilityprize train.csv (a local path) or a hub id with its columns")
    spec = get_task("read")
    df = _read_frame(path_or_id, cache_dir)
    missing = [c for c in READ_COLUMNS if c not in df.columns]
    if missing:
        raise PipelineError(f"`tasks.read_path` {path_or_id!r} lacks columns {missing}; Kaggle's train.csv has id, url_legal, license, excerpt, target, standard_error")
    train, dev = split_read(len(df), dev_fraction, seed)
    out = {}
    for split, rows in (("train", train), ("dev", dev)):
        part = df.iloc[rows]
        out[split] = to_table(spec, {
            "idx": [int(i) for i in rows],
            "text_a": part["excerpt"].astype(str).tolist(),
            "text_b": [None] * len(part),
            "choices": [None] * len(part),
            "label": [float(v) for v in part["target"]],
        })
    return out


def load_hub_task(task: str, *, glue_hub_id: str = "nyu-mll/glue", swag_hub_id: str = "allenai/swag",
                  read_path: str = "", read_dev_fraction: float = 0.1, seed: int = 0) -> dict[str, pa.Table]:
    """Any of the ten tasks from its real source."""
    get_task(task)
    if task == "swag":
        return load_swag(swag_hub_id)
    if task == "read":
        return load_read(read_path, read_dev_fraction, seed)
    return load_glue(task, glue_hub_id)
