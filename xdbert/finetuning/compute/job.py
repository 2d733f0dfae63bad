"""A finetuning job: one model and one task, tokenized once, picklable for the worker pool.

`xdbert.finetuning.control.prepare` makes one; `build_model` gives each seed a fresh model with a new head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from xdbert.data.tasks.registry import TaskSpec
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute.heads import ClipTowerClassifier, EncoderClassifier, FullModelClassifier, RowSubsetEmbedding
from xdbert.finetuning.compute.hyperparameters import Hyperparameters


@dataclass
class Job:
    """Everything a worker needs for one (model, task): picklable, tokenized once."""

    model_kind: str                      # encoder, clip or full (`xdbert.finetuning.control.runs`)
    model_path: str
    spec: TaskSpec
    hyperparameters: Hyperparameters
    data: dict[str, fd.Encoded]          # "train" and every dev split
    eot_id: int = 49407
    size: str = "base"                   # Table 5's size class the learning rate was taken for
    identity: str = ""                   # hash of the code, the model's files and the tokenized data (`keys.job_identity`)
    run_cache: str = ""                  # where finished runs are kept by what decided them (the grid); "" = nowhere

    @property
    def dev_splits(self) -> tuple[str, ...]:
        return self.spec.dev_splits


def clip_token_ids(job: Job) -> np.ndarray:
    """Every CLIP id in the job's splits (padding, [SOT] and [EOT] included)."""
    return np.unique(np.concatenate([np.unique(d.clip_ids) for d in job.data.values()]))


def build_model(job: Job) -> nn.Module:
    """The model of `job.model_kind` with a fresh task head (initialised from the current torch RNG)."""
    if job.model_kind == "encoder":
        return EncoderClassifier(job.model_path, job.spec)
    from xdbert.model.saving import load_clip_tower, load_full

    if job.model_kind == "full":
        model = FullModelClassifier(load_full(job.model_path), job.spec, job.hyperparameters.dropout)
        tower = model.xd.clip  # the CLIPTC decoder tied to its embedding was dropped with the heads
    else:
        tower, _ = load_clip_tower(job.model_path)
        model = ClipTowerClassifier(tower, job.spec, job.hyperparameters.clip_blocks_per_sentence,
                                    job.hyperparameters.dropout, job.eot_id)
    tower.token_embedding = RowSubsetEmbedding(tower.token_embedding, clip_token_ids(job))
    return model
