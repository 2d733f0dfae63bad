"""One run's hyperparameters: the `finetune` values a run takes as they are, with its learning rate.

`FinetuneSettings` (xdbert.finetuning.control.settings) checks the values and gives each run its
`Hyperparameters`; everything a run computes reads them from here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunValues:
    """The `finetune` values a run takes as they are: what `FinetuneSettings` and `Hyperparameters` share."""

    epochs: int
    warmup_ratio: float
    batch_size: int
    eval_batch_size: int
    max_len: int
    weight_decay: float
    length_group: int               # batches per length-sorted mega-batch; 1 = plain shuffled batches
    clip_blocks_per_sentence: int   # Table 8: 2 blocks for one sentence, 4 for a pair
    dropout: float                  # before the new head of the clip and full kinds
    precision: str                  # auto | bf16 | fp16 | no (xdbert.training.mixed_precision)
    compile: bool | str             # torch.compile the model (lengths dynamic): true, false, auto (on a GPU)
    cuda_graph: bool                # record each step whole as a CUDA graph (on a GPU; xdbert.finetuning.compute.graphed)
    stack: int                      # seeds trained as one stacked model (xdbert.finetuning.compute.stacked); 1 = each alone


@dataclass(frozen=True)
class Hyperparameters(RunValues):
    """One run's hyperparameters: the `finetune` values with the run's learning rate.

    Written to metrics.json as `hyperparameters`, and part of what a saved seed must match to be reused.
    """

    lr: float
    layer_lr_decay: float           # the family's: 1.0 = off; 0.9 = each layer below the top gets lr * 0.9^depth
    max_grad_norm: float
