"""The `finetune` section as settings: what a task's runs use, checked once, and one run's hyperparameters.

`FinetuneSettings.from_params(params, task)` checks every value the runs of `task` read and raises
`PipelineError` naming the full key; `FinetuneSettings.hyperparameters(size, model_kind)` gives one
run's `Hyperparameters`, with the paper's Table 5 learning rate for the model's size.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from xdbert import params
from xdbert.data.tasks.names import task_names
from xdbert.data.tasks.registry import TASK_NAMES, VIS_SPEC, TaskSpec
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.hyperparameters import Hyperparameters, RunValues
from xdbert.finetuning.control.runs import Run, Study, seed_list
from xdbert.precisions import PRECISIONS

LARGE_WIDTH = 1024          # Table 5: "large" models (BERT-l, ELECTRA-l) are 1024 wide
MAX_GRAD_NORM = 1.0         # gradient clipping, transformers' default; not a param
FINETUNE_KEYS = ("lr", "models", "ablations", "ablation_tasks", "ablation_lr", "ablation_seeds", "full_models",
                 "clip_tasks", "seeds", "rte_seeds", "epochs", "warmup_ratio", "batch_size", "eval_batch_size",
                 "max_len", "weight_decay", "length_group", "clip_blocks_per_sentence", "dropout",
                 "precision", "compile", "cuda_graph", "stack")  # a typo among them is refused


def size_of(width: int) -> str:
    """Table 5's model size from the hidden width: large at 1024 and above, else base."""
    return "large" if width >= LARGE_WIDTH else "base"


def learning_rate(table: dict, spec: TaskSpec, size: str, model_kind: str = "encoder") -> float:
    """`table[task][size]`: the paper's Table 5 written out per task, so one task's rate can change alone.

    The full cross-modal model (Table 8, whose rates the paper does not give) takes `table[task]["full"]`
    where the task has one, else the same rate as the encoder.
    """
    try:
        if model_kind == "full" and "full" in table[spec.name]:
            return float(table[spec.name]["full"])
        return float(table[spec.name][size])
    except (KeyError, TypeError) as e:
        raise PipelineError(f"`finetune.lr` needs `{spec.name}: {{{size}: <lr>}}` (Table 5: base 1e-4 for RTE, "
                            f"MRPC, STS-B and 2e-5 for the others; large 5e-5 and 1e-5)") from e


def seeds_key(task: TaskSpec) -> str:
    """RTE's dev set is the smallest and noisiest: it has seeds of its own (`finetune.rte_seeds`)."""
    return "rte_seeds" if task.name == "rte" else "seeds"


def _rates(lr: dict, name: str) -> None:
    rates = lr.get(name)
    if not isinstance(rates, dict):
        raise PipelineError(f"`finetune.lr.{name}` must map base, large (and optionally full, the full cross-modal "
                            f"model) to learning rates; got {rates!r}")
    unknown = sorted(set(rates) - {"base", "large", "full"}, key=str)
    if unknown:
        raise PipelineError(f"`finetune.lr.{name}` has unknown keys {unknown}; allowed: base, large, full (the full cross-modal model)")
    for size in ("base", "large", *(["full"] if "full" in rates else [])):
        params.positive(rates.get(size), f"finetune.lr.{name}.{size}", float)


@dataclass(frozen=True)
class FinetuneSettings(RunValues):
    """The `finetune` section for the runs of one task, checked."""

    task: TaskSpec
    lr: dict                        # task -> {base, large[, full]: rate}: Table 5, per task
    seeds: list[int]                # this task's seeds (`seeds`, or `rte_seeds` for RTE)
    study: Study                    # which models are finetuned

    @classmethod
    def from_params(cls, p: dict, task: TaskSpec, mechanism=None) -> FinetuneSettings:
        """`mechanism`: the mechanism study's settings where it is on (`Study.from_params`)."""
        f = params.section(p, "finetune", FINETUNE_KEYS)
        s: dict[str, Any] = {key: params.positive(params.get(f, key, "finetune"), f"finetune.{key}")
                             for key in ("epochs", "batch_size", "eval_batch_size", "max_len", "length_group",
                                         "clip_blocks_per_sentence", "stack")}
        if s["max_len"] > 512:
            raise PipelineError(f"`finetune.max_len` must be at most 512 (BERT's positions); got {s['max_len']}")
        for key in ("warmup_ratio", "weight_decay", "dropout"):
            s[key] = params.fraction(params.get(f, key, "finetune"), f"finetune.{key}")
        s["precision"] = params.choice(params.get(f, "precision", "finetune"), "finetune.precision", PRECISIONS)
        s["compile"] = params.compile_setting(params.get(f, "compile", "finetune"), "finetune.compile")
        s["cuda_graph"] = params.flag(params.get(f, "cuda_graph", "finetune"), "finetune.cuda_graph")
        lr = params.get(f, "lr", "finetune")
        if not isinstance(lr, dict):
            raise PipelineError(f"`finetune.lr` must map tasks to their rates, e.g. {{rte: {{base: 1.0e-4, large: 5.0e-5}}}}; got {lr!r}")
        params.subset(list(lr), "finetune.lr", (*TASK_NAMES, VIS_SPEC.name), nonempty=False)
        for name in dict.fromkeys([task.name, *lr]):  # every task's rates, this task's first: a typo shows in any stage
            _rates(lr, name)
        seeds = seed_list(f, seeds_key(task), "finetune")
        study = Study.from_params(p, mechanism)
        for key in ("ablation_tasks", "clip_tasks"):  # a task outside `tasks.names` has no data: its runs would be dropped
            params.subset(getattr(study, key), f"finetune.{key}", task_names(p), nonempty=False)
        return cls(task=task, **s, lr=lr, seeds=seeds, study=study)

    def hyperparameters(self, size: str, model_kind: str, protocol: str = "table1", layer_lr_decay: float = 1.0) -> Hyperparameters:
        """The hyperparameters of a run on a `size` model (Table 5's base or large) of `model_kind`, under
        Table 1's protocol or Table 3's (`ablation`: its one rate, where it gives one), with its family's
        layer-wise decay."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(RunValues)}
        lr = self.study.protocol.lr if protocol == "ablation" else None
        if lr is None:
            lr = learning_rate(self.lr, self.task, size, model_kind)
        # Only an encoder's forward can be vmapped (`stacked`): the other kinds' shapes follow which CLIP
        # blocks each batch uses (`ClipLayout`), which differs between the seeds' batches, so they train
        # each seed alone.
        stack = self.stack if model_kind == "encoder" else 1
        return Hyperparameters(**{**shared, "stack": stack}, lr=lr, layer_lr_decay=layer_lr_decay,
                               max_grad_norm=MAX_GRAD_NORM)

    def seeds_of(self, run: Run) -> list[int]:
        """The seeds of a run: the task's, or Table 3's protocol's where it gives them."""
        return self.study.protocol.seeds if run.protocol == "ablation" and self.study.protocol.seeds else self.seeds
