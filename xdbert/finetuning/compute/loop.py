"""Training one seed of a job and predicting every dev split.

Randomness is a pure function of the seed: the new head's initial weights, the batch order of each
epoch and the dropout of each step are seeded from (seed, position), so the same seed gives the same
predictions (on the CPU, with the same number of threads), and different seeds differ.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdbert import training
from xdbert.data.tasks.metrics import compute_metrics
from xdbert.data.tasks.registry import TaskSpec
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute import graphed
from xdbert.finetuning.compute.hyperparameters import Hyperparameters
from xdbert.finetuning.compute.job import Job, build_model
from xdbert.finetuning.compute.rates import parameter_groups
from xdbert.model.modeling import locate


def task_loss(spec: TaskSpec, scores: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over classes or choices; mean squared error for regression (as transformers' heads).
    `reduction="none"`: one loss per example."""
    scores = scores.float()
    if spec.kind == "regression":
        return F.mse_loss(scores.reshape(-1), labels.float(), reduction=reduction)
    return F.cross_entropy(scores, labels, reduction=reduction)


def pad_multiple(max_len: int, device: torch.device) -> int:
    """What batch lengths are rounded up to. On a GPU 8: bf16 tensor cores want it, and it bounds the
    distinct batch shapes at max_len / 8, since cuDNN's attention builds a plan (about a second) the
    first time a process meets a shape, and each shape of a recorded step is a graph of its own. The
    CLIP blocks of the `clip` and `full` kinds are laid out to the same multiple (`ClipLayout.of`). On
    the CPU 1: exact lengths are fastest there. A max_len that is no multiple of 8 keeps exact lengths,
    so no batch grows beyond it."""
    return 8 if device.type == "cuda" and max_len % 8 == 0 else 1


# How a GPU compiles the model (`finetune.compile`): a step of a base model on short batches is bound by
# the CPU launching ~1,200 small kernels. Compiling fuses most of them, and CUDA graphs (`reduce-overhead`)
# replay the forward's and the backward's kernels of each batch shape with one launch each
# (bench/finetune_share.py measures both). A step recorded whole (`finetune.cuda_graph`, xdbert.finetuning
# .graphed) holds the compiled kernels in its own graph instead.
CUDA_COMPILE_MODE = "reduce-overhead"


def compiled(model: nn.Module, device: torch.device, recorded: bool = False) -> nn.Module:
    """The model compiled for `device`. One graph serves every batch length (dynamic), so length-grouped
    batches do not recompile; CUDA graphs are recorded once per batch shape, by torch.compile unless the
    whole step is `recorded`."""
    mode = CUDA_COMPILE_MODE if device.type == "cuda" and not recorded else None
    return torch.compile(model, dynamic=True, mode=mode)


class Stepping(NamedTuple):
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    precision: training.Precision
    compiling: bool
    recorded: bool
    forward: nn.Module


def stepping(model: nn.Module, s: Hyperparameters, device: torch.device, total: int, groups: list[dict]) -> Stepping:
    """What a run's steps are made of, for one seed and for a stack alike: AdamW over `groups` with its
    warmup schedule of `total` steps, the precision for `device`, and the forward the steps call (compiled
    where `s.compile` asks for it on this device; with `s.cuda_graph`, the whole step is to be recorded)."""
    optimizer, schedule = training.optimizer_and_schedule(model, s.lr, s.weight_decay, s.warmup_ratio, total, groups)
    precision = training.Precision(s.precision, device)
    compiling = training.compiles(s.compile, device)
    recorded = graphed.records(s.cuda_graph, device, precision.name)
    return Stepping(optimizer, schedule, precision, compiling, recorded,
                    compiled(model, device, recorded) if compiling else model)


def epoch_loss(losses: list[torch.Tensor], step: int, where: str) -> float:
    """The mean of an epoch's step losses, checked here rather than at every step: reading a loss on the
    CPU waits for the GPU, and a step of short batches is too quick to pay that wait. A run whose loss
    became non-finite raises at its epoch's end, naming the first such step; nothing of it is kept."""
    stacked = torch.stack(losses)
    finite = torch.isfinite(stacked)
    if not finite.all():
        first = int((~finite).nonzero()[0])
        training.check_finite(stacked[first], step - len(losses) + first, where)
    return float(stacked.mean())


def host_batch(job: Job, data: fd.Encoded, rows: np.ndarray, multiple: int) -> dict:
    """The batch of examples `rows` and, when it has CLIP blocks, which of them hold tokens (`ClipLayout`):
    found here on the host, the `clip` and `full` kinds' forward reads nothing of its data on the GPU.
    `multiple` rounds the batch length and the CLIP layout alike (`pad_multiple`)."""
    batch = fd.collate(data, rows, multiple)
    if "clip_ids" in batch:
        ids = torch.from_numpy(batch["clip_ids"])
        batch.update(locate({"clip_ids": ids.reshape(-1, *ids.shape[-2:])}, job.eot_id, multiple))
    return batch


@torch.no_grad()
def predict(model: nn.Module, job: Job, data: fd.Encoded, device: torch.device, autocast) -> np.ndarray:
    """Predicted class / choice (int64) or score (float64) of every example, in the split's order."""
    model.eval()
    out: np.ndarray | None = None
    multiple = pad_multiple(job.hyperparameters.max_len, device)
    for rows in fd.eval_batches(data.lengths, job.hyperparameters.eval_batch_size):
        batch = training.to_device(host_batch(job, data, rows, multiple), device)
        with autocast():
            scores = model(batch).float()
        if job.spec.kind == "regression":
            values = scores.reshape(-1).double().cpu().numpy()
        else:
            values = scores.argmax(-1).cpu().numpy().astype(np.int64)
        if out is None:
            out = np.zeros(len(data), dtype=values.dtype)
        out[rows] = values
    model.train()
    assert out is not None
    return out


def train_seed(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """Finetune a fresh copy of the model with `seed`; evaluate on every dev split.

    Returns {seed, metrics: {split: {...}}, predictions: {split: array}, first_epoch_loss,
    last_epoch_loss, steps, train_examples, train_seconds, eval_seconds, seconds (all, model loading
    included)}. A non-finite loss raises PipelineError.
    """
    s, spec = job.hyperparameters, job.spec
    device = torch.device(device)
    t0 = time.time()
    torch.manual_seed(training.step_seed(seed, -1))  # the new head's initial weights
    model = build_model(job).to(device)
    model.train()
    train = job.data["train"]
    lengths = train.lengths
    steps_per_epoch = math.ceil(len(train) / s.batch_size)
    total = steps_per_epoch * s.epochs
    groups = parameter_groups(model, s.lr, s.weight_decay, s.layer_lr_decay)
    for g in groups:
        g.pop("names")
    optimizer, schedule, precision, compiling, recorded, forward = stepping(model, s, device, total, groups)

    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with precision.autocast():
            scores = forward(batch)
        loss = task_loss(spec, scores, batch["labels"])
        precision.scale(loss).backward()
        precision.step(optimizer, model.parameters(), s.max_grad_norm)
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    run_step = graphed.GraphedStep(train_step, optimizer, recorded)
    where = f"finetune {job.model_kind} {Path(job.model_path).name} {spec.name} seed {seed}"
    multiple = pad_multiple(s.max_len, device)
    epoch_losses, step = [], 0
    t_train = time.time()
    for epoch in range(s.epochs):
        losses = []
        for rows in fd.length_grouped_batches(lengths, s.batch_size, seed, epoch, s.length_group):
            batch = training.to_device(host_batch(job, train, rows, multiple), device)
            torch.manual_seed(training.step_seed(seed, -2, step))  # dropout of this step
            if compiling and not recorded:
                torch.compiler.cudagraph_mark_step_begin()
            losses.append(run_step(batch))
            schedule.step()
            step += 1
        epoch_losses.append(epoch_loss(losses, step, where))

    t_eval = time.time()
    predictions = {}
    for split in job.dev_splits:
        data = job.data[split]
        pred = predict(forward, job, data, device, precision.autocast)
        if len(pred) != len(data):
            raise PipelineError(f"{where}: {len(pred)} predictions for {len(data)} {split} examples")
        predictions[split] = pred
    return seed_result(job, seed, device, precision.name, predictions, epoch_losses, step, (t0, t_train, t_eval))


def seed_result(job: Job, seed: int, device: torch.device, precision: str, predictions: dict[str, np.ndarray],
                epoch_losses: list[float], steps: int, started: tuple[float, float, float], **stacked) -> dict:
    """One seed's result, trained alone (`train_seed`) or stacked (`stacked.train_stack`, whose `stacked`
    names the seeds trained with it), with the metrics of its `predictions` on every dev split.
    `started`: when the run, its training and its evaluation began."""
    t0, t_train, t_eval = started
    metrics = {split: compute_metrics(job.spec.name, pred, job.data[split].labels) for split, pred in predictions.items()}
    return {"seed": seed, **stacked, "device": training.device_name(device), "precision": precision,
            "metrics": metrics, "predictions": predictions,
            "first_epoch_loss": epoch_losses[0], "last_epoch_loss": epoch_losses[-1], "steps": steps,
            "train_examples": len(job.data["train"]) * job.hyperparameters.epochs,
            "train_seconds": round(t_eval - t_train, 3), "eval_seconds": round(time.time() - t_eval, 3),
            "seconds": round(time.time() - t0, 3)}
