"""The `aggregate` stage's settings: its own section and what it reads of `finetune`, `tasks`, `model` and `pretrain`."""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params
from xdbert.data.tasks.registry import TASK_NAMES, TaskSpec, get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.runs import Study, seed_list


@dataclass(frozen=True)
class AggregateSettings:
    """What the `aggregate` stage reads: its own section, the study's runs and seeds (`finetune`), the
    tasks and the models the reports' header names."""

    profile: str
    n_boot: int                 # paired bootstrap resamples of the dev examples
    seed: int                   # of the resampling
    tasks: list[TaskSpec]       # `tasks.names`: the tables' columns
    study: Study
    seeds: list[int]
    rte_seeds: list[int]
    encoder: str                # `model.encoder`
    clip: str                   # `model.clip`
    clip_pretrained: str        # `model.clip_pretrained`
    clip_steps: int             # `pretrain.clip_steps`

    @classmethod
    def from_params(cls, p: dict) -> AggregateSettings:
        agg, f = params.section(p, "aggregate"), params.section(p, "finetune")
        n_boot = params.positive(params.get(agg, "n_boot", "aggregate"), "aggregate.n_boot")
        seed = params.get(agg, "seed", "aggregate")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise PipelineError(f"`aggregate.seed` must be a non-negative integer; got {seed!r}")
        names = params.subset(params.get(params.section(p, "tasks"), "names", "tasks"), "tasks.names", TASK_NAMES)
        model, pretrain = params.section(p, "model"), params.section(p, "pretrain")
        return cls(profile=p["profile"], n_boot=n_boot, seed=seed, tasks=[get_task(t) for t in names],
                   study=Study.from_params(f), seeds=seed_list(f, "seeds", "finetune"),
                   rte_seeds=seed_list(f, "rte_seeds", "finetune"), encoder=params.get(model, "encoder", "model"),
                   clip=params.get(model, "clip", "model"), clip_pretrained=params.get(model, "clip_pretrained", "model"),
                   clip_steps=params.get(pretrain, "clip_steps", "pretrain"))
