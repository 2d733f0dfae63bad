"""The ten finetuning tasks, their one normalized schema, and how a task directory is written.

Every task, from the hub or generated, becomes the same Arrow columns::

    idx      int64            example id (the hub's `idx` where it has one, else the row number)
    text_a   string           first sentence / premise / question / SWAG context / READ excerpt
    text_b   string, nullable second sentence / hypothesis; null for single-sentence tasks;
                              for SWAG the start of the next sentence (`sent2`) that every ending continues
    choices  list<string>, nullable  the 4 SWAG endings; null otherwise
    label    int64 (class index, GLUE's label order) or float64 (STS-B 0-5, READ target)

Layout: `data/tasks/<task>/<split>.parquet` with split `train` and the task's dev splits, plus
`data/tasks/summary.json` (sizes and label distribution per split).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xdbert.errors import PipelineError
from xdbert.io import atomic_path, read_parquet, write_parquet

TASK_KINDS = ("classification", "regression", "multiple_choice")


@dataclass(frozen=True)
class TaskSpec:
    """What the finetuning, aggregation and report stages need to know about one task."""

    name: str
    kind: str                 # one of TASK_KINDS
    num_labels: int           # classes; 1 for regression; choices for multiple choice
    pair: bool                # text_b is set (sentence-pair input)
    dev_splits: tuple[str, ...]
    metric: str               # the headline metric (Table 1)
    higher_is_better: bool
    metrics: tuple[str, ...]  # everything reported, headline first
    label_names: tuple[str, ...] = ()

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train",) + self.dev_splits

    @property
    def label_type(self) -> pa.DataType:
        return pa.float64() if self.kind == "regression" else pa.int64()


_DEV = ("dev",)
TASK_SPECS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("rte", "classification", 2, True, _DEV, "accuracy", True, ("accuracy",),
             ("entailment", "not_entailment")),
    TaskSpec("mrpc", "classification", 2, True, _DEV, "f1", True, ("f1", "accuracy"),
             ("not_equivalent", "equivalent")),
    TaskSpec("stsb", "regression", 1, True, _DEV, "spearman", True, ("spearman", "pearson")),
    TaskSpec("cola", "classification", 2, False, _DEV, "matthews", True, ("matthews", "accuracy"),
             ("unacceptable", "acceptable")),
    TaskSpec("sst2", "classification", 2, False, _DEV, "accuracy", True, ("accuracy",),
             ("negative", "positive")),
    TaskSpec("qnli", "classification", 2, True, _DEV, "accuracy", True, ("accuracy",),
             ("entailment", "not_entailment")),
    TaskSpec("qqp", "classification", 2, True, _DEV, "accuracy", True, ("accuracy", "f1"),
             ("not_duplicate", "duplicate")),
    TaskSpec("mnli", "classification", 3, True, ("dev_matched", "dev_mismatched"), "accuracy", True,
             ("accuracy",), ("entailment", "neutral", "contradiction")),
    TaskSpec("swag", "multiple_choice", 4, True, _DEV, "accuracy", True, ("accuracy",)),
    TaskSpec("read", "regression", 1, False, _DEV, "rmse", False, ("rmse",)),
)}
TASK_NAMES = tuple(TASK_SPECS)


def task_names(params: dict) -> list[str]:
    """`tasks.names`, checked: the tasks every later stage finetunes and reports on."""
    from xdbert import params as P

    return P.subset(P.get(P.section(params, "tasks"), "names", "tasks"), "tasks.names", TASK_NAMES)


def get_task(name: str) -> TaskSpec:
    """The spec of task `name`; an unknown name is a PipelineError listing the allowed ones."""
    if name not in TASK_SPECS:
        raise PipelineError(f"unknown task {name!r}; allowed: {', '.join(TASK_NAMES)}")
    return TASK_SPECS[name]


def schema(spec: TaskSpec) -> pa.Schema:
    """The normalized Arrow schema of `spec`'s parquet files."""
    return pa.schema([
        ("idx", pa.int64()),
        ("text_a", pa.string()),
        ("text_b", pa.string()),
        ("choices", pa.list_(pa.string())),
        ("label", spec.label_type),
    ])


def to_table(spec: TaskSpec, columns: dict[str, list]) -> pa.Table:
    """Build and check one split: the columns of `schema(spec)`, consistent with the task's kind."""
    missing = [c for c in ("idx", "text_a", "text_b", "choices", "label") if c not in columns]
    if missing:
        raise ValueError(f"{spec.name}: missing columns {missing}")
    table = pa.Table.from_pydict({k: columns[k] for k in schema(spec).names}, schema=schema(spec))
    _check(spec, table)
    return table


def _check(spec: TaskSpec, table: pa.Table) -> None:
    """Invariants every writer of a task must keep (a wrong loader fails here, not in finetuning)."""
    n = table.num_rows
    if table.column("text_a").null_count:
        raise ValueError(f"{spec.name}: text_a has nulls")
    nb = table.column("text_b").null_count
    if spec.pair and nb:
        raise ValueError(f"{spec.name}: pair task with null text_b")
    if not spec.pair and nb != n:
        raise ValueError(f"{spec.name}: single-sentence task with text_b set")
    choices = table.column("choices")
    if spec.kind == "multiple_choice":
        lengths = pc.list_value_length(choices).to_numpy(zero_copy_only=False)
        if choices.null_count or (n and not (lengths == spec.num_labels).all()):
            raise ValueError(f"{spec.name}: every row needs {spec.num_labels} choices")
    elif choices.null_count != n:
        raise ValueError(f"{spec.name}: choices set on a task without choices")
    labels = table.column("label").to_numpy()
    if np.isnan(labels.astype(float)).any():
        raise ValueError(f"{spec.name}: NaN labels")
    if spec.kind != "regression" and n and (labels.min() < 0 or labels.max() >= spec.num_labels):
        raise ValueError(f"{spec.name}: labels outside 0..{spec.num_labels - 1}")


def split_summary(spec: TaskSpec, table: pa.Table) -> dict[str, Any]:
    """Size and label distribution of one split (counts per class, or moments of a score)."""
    labels = table.column("label").to_numpy()
    out: dict[str, Any] = {"size": table.num_rows}
    if spec.kind == "regression":
        out["label"] = {"mean": round(float(labels.mean()), 4), "std": round(float(labels.std()), 4),
                        "min": round(float(labels.min()), 4), "max": round(float(labels.max()), 4)}
    else:
        counts = Counter(int(x) for x in labels)
        names = spec.label_names or tuple(str(i) for i in range(spec.num_labels))
        out["label"] = {names[i]: counts.get(i, 0) for i in range(spec.num_labels)}
    return out


def write_tasks(tables: dict[str, dict[str, pa.Table]], out_dir: str | Path, source: str) -> dict[str, Any]:
    """Write every task's splits and `summary.json` into `out_dir` as one atomic directory."""
    summary: dict[str, Any] = {"source": source, "tasks": {}}
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for name, splits in tables.items():
            spec = get_task(name)
            if set(splits) != set(spec.splits):
                raise ValueError(f"{name}: splits {sorted(splits)} != {list(spec.splits)}")
            (tmp / name).mkdir()
            entry = {"kind": spec.kind, "metric": spec.metric, "splits": {}}
            for split in spec.splits:
                _check(spec, splits[split])
                write_parquet(splits[split].cast(schema(spec)), tmp / name / f"{split}.parquet")
                entry["splits"][split] = split_summary(spec, splits[split])
            summary["tasks"][name] = entry
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return summary


def read_split(task_dir: str | Path, task: str, split: str) -> pa.Table:
    """One split of one task as written by `write_tasks`."""
    spec = get_task(task)
    if split not in spec.splits:
        raise PipelineError(f"task {task} has no split {split!r}; it has: {', '.join(spec.splits)}")
    return read_parquet(Path(task_dir) / task / f"{split}.parquet", f"run `dvc repro tasks` with `{task}` in `tasks.names`")
