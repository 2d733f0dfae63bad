"""Stage `tasks`: every finetuning task in one normalized schema.

    outs:   data/tasks/<task>/{train,dev}.parquet (MNLI: dev_matched, dev_mismatched),
            data/tasks/summary.json,
            with `mechanism.enabled`: data/tasks/vis/{train,dev,dev_kinds}.parquet (the probe task)

`source: hub` loads GLUE, SWAG and CommonLit readability with `datasets`; `source: generated`
writes the embedded profile's deterministic stand-ins (same columns, labels and metrics). The mechanism
study's probe task `vis` is always generated, from the facts of the `mechanism` section.
"""
from __future__ import annotations

from xdbert import params as P
from xdbert.data import provided
from xdbert.data.mechanism import VIS, MechanismSettings
from xdbert.data.tasks import write_tasks
from xdbert.data.tasks.settings import TasksSettings
from xdbert.data.tasks.vis import DEV_KINDS, vis_task
from xdbert.paths import TASKS
from xdbert.stage import run


def read(p: dict) -> tuple[TasksSettings, list, MechanismSettings | None]:
    """(the tasks, the hand-provided files, the mechanism study or None when it is off): every param this stage
    reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    mechanism = MechanismSettings.from_params(p)
    return TasksSettings.from_params(p), provided.files(p), mechanism if mechanism.enabled else None


def main() -> None:
    # every check before any work: a bad value leaves an existing data/tasks exactly as it was
    settings, files, mechanism = read(P.load())
    provided.check_files(files)  # CommonLit's train.csv before any GLUE or SWAG download
    tables = {name: settings.load(name) for name in settings.names}
    sidecars = {}
    if mechanism:
        tables[VIS], kinds = vis_task(mechanism, settings.seed)
        sidecars[f"{VIS}/{DEV_KINDS}"] = kinds
    summary = write_tasks(tables, TASKS, settings.source, sidecars)
    for name, entry in summary["tasks"].items():
        sizes = ", ".join(f"{split} {s['size']}" for split, s in entry["splits"].items())
        print(f"tasks {name}: {sizes}")


if __name__ == "__main__":
    run(main)
