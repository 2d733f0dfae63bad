"""The `tasks` params section, checked, and where each task's tables come from."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from xdbert import params as P
from xdbert.data.tasks.names import checked_names
from xdbert.data.tasks.registry import TASK_NAMES
from xdbert.errors import PipelineError

SOURCES = ("generated", "hub")
TASKS_KEYS = ("source", "names", "train_size", "train_sizes", "dev_size", "read_path", "read_dev_fraction",
              "glue_hub_id", "swag_hub_id", "seed")  # a typo among them is refused


@dataclass(frozen=True)
class TasksSettings:
    """The `tasks` params section, checked.

    Every key is checked whatever the `source`, so a bad value shows before a switch of source, not
    after. Kept: source, names, seed; for `generated` also train_size, train_sizes (per-task overrides,
    may be empty) and dev_size; for `hub` glue_hub_id (if a GLUE task is named), swag_hub_id (if `swag`
    is), read_path and read_dev_fraction (if `read` is). Keys not kept stay None.
    """

    source: str
    names: tuple[str, ...]
    seed: int
    train_size: int | None = None
    train_sizes: dict[str, int] | None = None
    dev_size: int | None = None
    glue_hub_id: str | None = None
    swag_hub_id: str | None = None
    read_path: str | None = None
    read_dev_fraction: float | None = None

    @classmethod
    def from_params(cls, params: dict) -> "TasksSettings":
        sec = P.section(params, "tasks", TASKS_KEYS)
        get = P.getter(sec, "tasks")

        source = P.choice(get("source"), "tasks.source", SOURCES)
        names = checked_names(get("names"))
        if len(set(names)) != len(names):
            raise PipelineError(f"`tasks.names` lists a task twice: {names}")
        common = dict(source=source, names=tuple(names), seed=P.non_negative(get("seed"), "tasks.seed"))

        train_size = P.positive(get("train_size"), "tasks.train_size")
        train_sizes = sec.get("train_sizes")
        if train_sizes is None:  # absent, or `train_sizes:` with nothing after it: no overrides
            train_sizes = {}
        if not isinstance(train_sizes, dict):
            raise PipelineError(f"`tasks.train_sizes` must map task names to sizes, e.g. {{qnli: 2000}}; got {train_sizes!r}")
        P.subset(list(train_sizes), "tasks.train_sizes", TASK_NAMES, nonempty=False)
        train_sizes = {name: P.positive(size, f"tasks.train_sizes.{name}") for name, size in train_sizes.items()}
        dev_size = P.positive(get("dev_size"), "tasks.dev_size")
        hub_ids = {key: P.nonempty_str(get(key), f"tasks.{key}") for key in ("glue_hub_id", "swag_hub_id")}
        read_path = get("read_path")
        if not isinstance(read_path, str):
            raise PipelineError(f"`tasks.read_path` must be a path or hub id of CommonLit's train.csv, or \"\" without `read`; got {read_path!r}")
        frac = get("read_dev_fraction")
        if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
            raise PipelineError(f"`tasks.read_dev_fraction` must be a number between 0 and 1 (exclusive); got {frac!r}")
        if source == "generated":
            return cls(**common, train_size=train_size, train_sizes=dict(train_sizes), dev_size=dev_size)

        hub: dict = {}
        if set(names) - {"swag", "read"}:
            hub["glue_hub_id"] = hub_ids["glue_hub_id"]
        if "swag" in names:
            hub["swag_hub_id"] = hub_ids["swag_hub_id"]
        if "read" in names:
            if not read_path.strip():
                raise PipelineError("`tasks.read_path` is empty but `read` is in `tasks.names`: give the path of the Kaggle "
                                    "commonlitreadabilityprize train.csv (or a hub id with its columns), or drop `read`")
            hub["read_path"], hub["read_dev_fraction"] = read_path, float(frac)
        return cls(**common, **hub)

    def load(self, name: str) -> dict[str, pa.Table]:
        """The splits of task `name`: generated, or loaded from the hub."""
        if self.source == "generated":
            from xdbert.data.synthetic.tasks import generate_task

            return generate_task(name, self.train_sizes.get(name, self.train_size), self.dev_size, self.seed)
        from xdbert.data.tasks.hub import load_hub_task

        hub = {"seed": self.seed}
        hub.update({key: value for key, value in (("glue_hub_id", self.glue_hub_id), ("swag_hub_id", self.swag_hub_id),
                                                 ("read_path", self.read_path), ("read_dev_fraction", self.read_dev_fraction))
                    if value is not None})
        return load_hub_task(name, **hub)
