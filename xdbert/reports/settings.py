"""The `aggregate` stage's settings: its own section and what it reads of `finetune`, `families`, `tasks`,
`model` and `pretrain`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from xdbert import params
from xdbert.data.tasks.names import task_names
from xdbert.data.tasks.registry import TaskSpec, get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.control.runs import Study, seed_list
from xdbert.model.families import Family, families
from xdbert.model.settings import ModelSettings

CLIP_ROW = "CLIP-T"  # Table 1's row of CLIP's text tower alone
AGGREGATE_KEYS = ("n_boot", "seed")  # a typo among them is refused


@dataclass(frozen=True)
class AggregateSettings:
    """What the `aggregate` stage reads: its own section, the study's runs and seeds (`finetune`), its
    families, the tasks and the models the reports' header names."""

    profile: str
    n_boot: int                 # paired bootstrap resamples of the dev examples
    seed: int                   # of the resampling
    tasks: list[TaskSpec]       # `tasks.names`: the tables' columns
    study: Study
    seeds: list[int]
    rte_seeds: list[int]
    families: dict[str, Family]  # `families`: Tables 1 and 8 have rows of each, in this order
    encoders: dict[str, str]     # family name -> its encoder (`model.encoder`, or the family's own)
    clip: str                   # `model.clip`
    clip_pretrained: str        # `model.clip_pretrained`
    clip_steps: int             # `pretrain.clip_steps`

    @classmethod
    def from_params(cls, p: dict) -> AggregateSettings:
        agg, f = params.section(p, "aggregate", AGGREGATE_KEYS), params.section(p, "finetune")
        n_boot = params.positive(params.get(agg, "n_boot", "aggregate"), "aggregate.n_boot")
        seed = params.non_negative(params.get(agg, "seed", "aggregate"), "aggregate.seed")
        study = Study.from_params(p)
        if params.BASELINE not in study.models:  # the finetune stage alone runs without it; the tables cannot
            raise PipelineError(f"`finetune.models` must list {params.BASELINE}: every Δ row of Tables 1, 3 and 8 is "
                                f"against its family's {params.BASELINE}; got {study.models}")
        names = task_names(p)
        model, pretrain = ModelSettings.from_params(p), params.section(p, "pretrain")
        fams = families(p)
        check_row_labels(fams)
        return cls(profile=p["profile"], n_boot=n_boot, seed=seed, tasks=[get_task(t) for t in names],
                   study=study, seeds=seed_list(f, "seeds", "finetune"),
                   rte_seeds=seed_list(f, "rte_seeds", "finetune"), families=fams,
                   encoders={name: ModelSettings.from_params(p, name).encoder for name in fams},
                   clip=model.clip, clip_pretrained=model.clip_pretrained,
                   clip_steps=params.get(pretrain, "clip_steps", "pretrain"))


def check_row_labels(fams: dict[str, Family]) -> None:
    """The tables key their rows (and results/aggregate.json its entries) by label: two families whose labels
    make the same row would silently overwrite one another."""
    labels = Counter([CLIP_ROW] + [row for f in fams.values() for row in (f.label, f.xd_label, f.full_label)])
    clashes = sorted(label for label, n in labels.items() if n > 1)
    if clashes:
        raise PipelineError(f"the `families` labels make the table rows {', '.join(clashes)} more than once (a family's "
                            f"rows are <label>, XD<label> and X<label>, beside {CLIP_ROW}): give each family its own label")
