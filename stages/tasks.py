"""Stage `tasks`: every finetuning task in one normalized schema.

    params: profile, tasks.{source, names, train_size, train_sizes, dev_size, read_path, seed}
            hub mode also: tasks.{glue_hub_id, swag_hub_id, read_dev_fraction}
    outs:   data/tasks/<task>/{train,dev}.parquet (MNLI: dev_matched, dev_mismatched),
            data/tasks/summary.json

`source: hub` loads GLUE, SWAG and CommonLit readability with `datasets`; `source: generated`
writes the embedded profile's deterministic stand-ins (same columns, labels and metrics).
"""
from __future__ import annotations



from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.stage import run
from xdbert.tasks import TASK_NAMES, write_tasks
from xdbert.tasks.generate import generate_task
from xdbert.tasks.hub import load_hub_task

OUT = "data/tasks"
SOURCES = ("generated", "hub")


def _nonempty_str(value, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PipelineError(f"`{key}` must be a non-empty string; got {value!r}")
    return value


def _seed(value, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PipelineError(f"`{key}` must be a non-negative integer; got {value!r}")
    return value


def main() -> None:
    params = P.load()
    sec = P.section(params, "tasks")
    source = P.choice(P.get(sec, "source", "tasks"), "tasks.source", SOURCES)
    names = P.subset(P.get(sec, "names", "tasks"), "tasks.names", TASK_NAMES)
    if len(set(names)) != len(names):
        raise PipelineError(f"`tasks.names` lists a task twice: {names}")
    seed = _seed(P.get(sec, "seed", "tasks"), "tasks.seed")

    # every check before any work: a bad value leaves an existing data/tasks exactly as it was
    if source == "generated":
        train_size = P.positive(P.get(sec, "train_size", "tasks"), "tasks.train_size")
        train_sizes = sec.get("train_sizes") or {}
        if not isinstance(train_sizes, dict):
            raise PipelineError(f"`tasks.train_sizes` must map task names to sizes, e.g. {{qnli: 2000}}; got {train_sizes!r}")
        P.subset(list(train_sizes), "tasks.train_sizes", TASK_NAMES, nonempty=False)
        for name, size in train_sizes.items():
            P.positive(size, f"tasks.train_sizes.{name}")
        dev_size = P.positive(P.get(sec, "dev_size", "tasks"), "tasks.dev_size")
        load = lambda name: generate_task(name, train_sizes.get(name, train_size), dev_size, seed)  # noqa: E731
    else:
        hub = {"seed": seed}
        if set(names) - {"swag", "read"}:
            hub["glue_hub_id"] = _nonempty_str(P.get(sec, "glue_hub_id", "tasks"), "tasks.glue_hub_id")
        if "swag" in names:
            hub["swag_hub_id"] = _nonempty_str(P.get(sec, "swag_hub_id", "tasks"), "tasks.swag_hub_id")
        if "read" in names:
            hub["read_path"] = P.get(sec, "read_path", "tasks")
            if not isinstance(hub["read_path"], str) or not hub["read_path"].strip():
                raise PipelineError("`tasks.read_path` is empty but `read` is in `tasks.names`: give the path of the Kaggle "
                                    "commonlitreadabilityprize train.csv (or a hub id with its columns), or drop `read`")
            frac = P.get(sec, "read_dev_fraction", "tasks")
            if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
                raise PipelineError(f"`tasks.read_dev_fraction` must be a number between 0 and 1 (exclusive); got {frac!r}")
            hub["read_dev_fraction"] = float(frac)
        load = lambda name: load_hub_task(name, **hub)  # noqa: E731

    tables = {name: load(name) for name in names}
    summary = write_tasks(tables, OUT, source)
    for name, entry in summary["tasks"].items():
        sizes = ", ".join(f"{split} {s['size']}" for split, s in entry["splits"].items())
        print(f"tasks {name}: {sizes}")


if __name__ == "__main__":
    run(main)
