"""The finetuning tasks: GLUE (8), SWAG and READ in one normalized schema.

- `registry`: `TaskSpec` per task (kind, labels, dev splits, metrics, learning-rate class), the
  normalized Arrow schema and the on-disk layout of `data/tasks`.
- `hub`: the real data through `datasets` (paper profile).
- `generate`: deterministic stand-ins with the same schema and metrics (embedded profile).
- `metrics`: `compute_metrics(task, predictions, labels)` with scikit-learn / scipy.
"""
from xdbert.tasks.registry import TASK_NAMES, TASKS, TaskSpec, get_task, read_split, schema, write_tasks

__all__ = ["TASKS", "TASK_NAMES", "TaskSpec", "get_task", "compute_metrics", "headline", "read_split", "schema", "write_tasks"]


def __getattr__(name: str):
    # metrics pulls in scikit-learn and scipy (seconds of import); only code that scores loads them
    if name in ("compute_metrics", "headline"):
        from xdbert.tasks import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'xdbert.tasks' has no attribute {name!r}")
