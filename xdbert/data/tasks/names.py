"""`tasks.names`, checked: the tasks every later stage finetunes and reports on.

Apart from `registry`, which what a finetuning run computes imports, so that the params stay out of it.
"""
from __future__ import annotations

from xdbert import params as P
from xdbert.data.tasks.registry import TASK_NAMES, VIS_SPEC
from xdbert.errors import PipelineError


def task_names(params: dict) -> list[str]:
    """`tasks.names`, checked: the tasks every later stage finetunes and reports on."""
    return checked_names(P.get(P.section(params, "tasks"), "names", "tasks"))


def checked_names(names) -> list[str]:
    """`tasks.names` as given, checked: tasks of TASK_NAMES; the probe task `vis` refused by name."""
    if isinstance(names, list) and VIS_SPEC.name in names:
        raise PipelineError(f"`tasks.names` lists {VIS_SPEC.name!r}, the mechanism study's probe task: it is not a Table 1 "
                            f"column; the tasks and finetune stages add it when `mechanism.enabled` is true. Allowed: "
                            f"{', '.join(TASK_NAMES)}")
    return P.subset(names, "tasks.names", TASK_NAMES)
