"""The adaptation loop: train the cross-modal ensemble on token windows with MLM, MATCH and CLIPTC (and distill).

One optimizer step sees `batch_size` windows (the paper: 256), split into micro-batches whose gradients
are accumulated. `accelerate` places the model and, when the stage runs in several processes (one per
GPU: stages/adapt.py launches them), splits every step's micro-batches across them. Micro-batch j of a
step is masked and dropped out from seeds of (seed, step, j) alone, whichever process computes it, so
N processes take the steps one process takes, up to the order of float sums.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from xdbert import training
from xdbert.adaptation import masking
from xdbert.adaptation.settings import AdaptSettings
from xdbert.model import LOSSES, UNSCORED
from xdbert.model.modeling import locate

MAX_GRAD_NORM = 1.0  # gradient clipping, as BERT's pretraining


class BatchMaker:
    """Turns shard rows into a training batch: MLM masking, MATCH negatives, CLIPTC and distill targets, and where
    the batch's CLIP tokens and targets are (`locate`: found here, on the host, the model's forward reads
    nothing of its data on the GPU)."""

    def __init__(self, settings: AdaptSettings, n_blocks: int, attribute_ids: Sequence[int] = (), **token_ids):
        # token_ids: vocab_size, special_ids, mask_id, eot_id (see masking.adaptation_inputs); attribute_ids: the
        # mechanism study's attribute words, MLM targets at `attribute_mlm_prob` where that is above 0
        if settings.attribute_mlm_prob > 0 and not attribute_ids:
            raise ValueError("`attribute_mlm_prob` above 0 needs the attribute words' ids")
        self.s, self.n_blocks, self.token_ids = settings, n_blocks, token_ids
        self.attribute_ids = tuple(attribute_ids)

    def __call__(self, rows: dict[str, np.ndarray], gen: torch.Generator) -> dict[str, torch.Tensor]:
        batch = {
            "bert_ids": torch.from_numpy(rows["bert_ids"].astype(np.int64)),
            "bert_mask": torch.from_numpy(rows["bert_mask"].astype(np.int64)),
            "clip_ids": torch.from_numpy(rows["clip_ids"].astype(np.int64)).view(len(rows["clip_ids"]), self.n_blocks, -1),
        }
        if {"distill", "kl"} & set(self.s.losses):  # the alignment, read only where a loss uses it
            batch |= {k: torch.from_numpy(rows[k].astype(np.int64)) for k in ("align_start", "align_end")}
        batch = masking.adaptation_inputs(batch, self.s.losses, gen, mlm_prob=self.s.mlm_prob,
                                          match_prob=self.s.match_prob, cliptc_prob=self.s.cliptc_prob,
                                          mlm_negatives=self.s.mlm_negatives, focus_ids=self.attribute_ids,
                                          focus_prob=self.s.attribute_mlm_prob, **self.token_ids)
        return {**batch, **locate(batch, self.token_ids["eot_id"])}


def weighted_loss(out: dict, weights: dict | None) -> torch.Tensor:
    """The trained loss: the model's objectives summed, each times its weight (1 when not given)."""
    if not weights:
        return out["loss"]
    return sum(float(weights.get(name, 1.0)) * out[f"{name}_loss"] for name in LOSSES
               if f"{name}_loss" in out)


def _sum_counts(out: dict, totals: dict) -> None:
    """Add a forward pass's per-objective counts to `totals` (losses weighted by their target counts).

    The sums stay on the model's device, in float64 as Python's floats would be: reading a count on the
    host waits for the GPU to finish the pass, so one read a step (`read_counts`) replaces one a pass.
    """
    for name in LOSSES:
        if f"{name}_count" in out:
            n = out[f"{name}_count"].double()
            _add(totals, f"{name}_count", n)
            if name not in UNSCORED:
                _add(totals, f"{name}_correct", out[f"{name}_correct"].double())
            _add(totals, f"{name}_loss_sum", out[f"{name}_loss"].detach().double() * n)


def _add(totals: dict, key: str, value: torch.Tensor) -> None:
    totals[key] = totals[key] + value if key in totals else value


def read_counts(totals: dict, losses, device, accelerator: Accelerator | None = None) -> dict:
    """The summed counts (and `loss`, the step's summed loss) as floats, over every process with
    `accelerator`: one read from the device, so each process's metrics cover the whole batch."""
    keys = ["loss"] + [f"{name}_{part}" for name in losses for part in ("count", "correct", "loss_sum")
                       if not (part == "correct" and name in UNSCORED)]
    zero = torch.zeros((), dtype=torch.float64, device=device)
    summed = torch.stack([totals.get(k, zero).to(torch.float64) for k in keys])
    if accelerator is not None and accelerator.num_processes > 1:
        summed = accelerator.reduce(summed, reduction="sum")
    return dict(zip(keys, summed.tolist()))


def summarize(totals: dict) -> dict:
    """Mean losses, accuracies and MLM perplexity from summed counts."""
    m = {}
    for name in LOSSES:
        n = totals.get(f"{name}_count", 0)
        if n:
            m[f"{name}_loss"] = totals[f"{name}_loss_sum"] / n
            if name not in UNSCORED:
                m[f"{name}_accuracy"] = totals[f"{name}_correct"] / n
    if "mlm_loss" in m:
        m["mlm_perplexity"] = math.exp(min(m["mlm_loss"], 50.0))
    return m


@torch.no_grad()
def evaluate(model: torch.nn.Module, valid, make_batch: BatchMaker, settings: AdaptSettings, device,
             autocast=contextlib.nullcontext) -> dict:
    """Losses and accuracies on `eval_windows` valid windows, a fixed random sample, with a fixed masking seed,
    computed in the training's precision (`autocast`: `Precision.autocast`).

    The sample is shuffled like a training epoch: consecutive windows are cut from the same document, so
    micro-batches of them would draw most MATCH negatives from the window's own article, a harder task
    than the one trained (whose batches are random) and a different one on every corpus.
    """
    model.eval()
    n = min(len(valid), settings.eval_windows)
    sample = training.epoch_order(len(valid), settings.seed, -1)[:n]
    totals: dict = {}
    positives = 0
    for i, start in enumerate(range(0, n, settings.micro_batch_size)):
        rows = valid[np.sort(sample[start:start + settings.micro_batch_size])]
        batch = make_batch(rows, training.generator(settings.seed, -1, i))
        with autocast():
            out = model(**training.to_device(batch, device))
        _sum_counts(out, totals)
        if "match_labels" in batch:
            positives += int(batch["match_labels"].sum())
    model.train()
    totals = read_counts(totals, settings.losses, device)
    metrics = summarize(totals)
    if totals.get("match_count"):
        # What a model that learned nothing scores on these windows: the negatives are drawn at random,
        # so the two classes are only about even.
        share = positives / totals["match_count"]
        metrics["match_majority"] = max(share, 1 - share)
    return metrics


def total_steps(corpus_windows: int, settings: AdaptSettings) -> int:
    """The optimizer steps of an adaptation: `epochs` passes over the corpus's `corpus_windows` train windows, in
    batches of `batch_size` (the last of a pass holds what is left). The caption control (`text: captions`)
    takes as many over its own windows, so it is compared with the baseline at the same steps."""
    return math.ceil(corpus_windows / settings.batch_size) * settings.epochs


def adapt(
    model: torch.nn.Module,
    train,
    valid,
    make_batch: BatchMaker,
    settings: AdaptSettings,
    checkpoint: Path,
    log: Callable[[dict, int], None] | None = None,
    stop_after: int | None = None,
    steps: int | None = None,
) -> dict:
    """Train `model` over `train` for `steps` optimizer steps (None: `settings.epochs` passes over `train`);
    resume from `checkpoint` when it matches.

    Each pass over `train` takes its windows in an order of its own, drawn from (seed, pass): a run of more
    steps than `epochs` passes hold (the caption control on fewer windows than the corpus) starts another.
    Returns the metrics: final training losses (mean over the last 10% of steps) and the valid metrics.
    `stop_after` ends the run early after that many optimizer steps (tests use it to simulate a kill).
    """
    s = settings
    # accelerate places the model and runs DDP; precision is training.Precision's, one code path on GPU and CPU
    accelerator = Accelerator(mixed_precision="no", cpu=not torch.cuda.is_available())
    precision = training.Precision(s.precision, accelerator.device)
    steps_per_epoch = math.ceil(len(train) / s.batch_size)
    total = total_steps(len(train), s) if steps is None else steps
    optimizer, schedule = training.optimizer_and_schedule(model, s.lr, s.weight_decay, s.warmup_ratio, total)
    data_hash = (getattr(train, "manifest", None) or {}).get("content_sha256")
    print_fp = training.fingerprint(asdict(s), precision.name, len(train), data_hash, total,
                                    *training.model_identity(model))
    # The schedule is not prepared: accelerate would step it once per process at every optimizer step,
    # but here every step already covers the whole `batch_size` across all processes.
    model, optimizer = accelerator.prepare(model, optimizer)
    world, rank = accelerator.num_processes, accelerator.process_index
    # Compiling fuses the step's many small kernels: an H200 step of BERT-b's XDBERT took 0.666 s compiled
    # against 0.862 eager, after 92 s of compiling (bench/results/h200), so it pays within one wiki103
    # epoch. Only the training steps go through the compiled wrapper; checkpoints, evaluation and saving use
    # the module itself.
    forward = torch.compile(model) if training.compiles(s.compile, accelerator.device) else model

    checkpoints = training.Checkpoints(checkpoint, print_fp, {
        "model": accelerator.unwrap_model(model), "optimizer": optimizer, "schedule": schedule,
        "scaler": precision.scaler}, s.checkpoint_every, total, stop_after)
    state = checkpoints.resume(accelerator.print)
    start, history, rates = (state["step"], state["history"], state["rates"]) if state else (0, [], [])
    if log is not None and accelerator.is_main_process:
        # The log (dvclive's plots, a DVC output) starts empty in a new process: replay the steps
        # already taken (none in a fresh run), so a resumed run's plots are the uninterrupted run's, byte for byte.
        for step, (metrics, lr) in enumerate(zip(history, rates)):
            log({**metrics, "lr": lr}, step)

    model.train()
    bar = tqdm(range(start, total), initial=start, total=total, desc="adapt", disable=not accelerator.is_main_process)
    t0 = time.time()
    for step in bar:
        epoch, k = divmod(step, steps_per_epoch)
        order = training.epoch_order(len(train), s.seed, epoch)
        ids = order[k * s.batch_size:(k + 1) * s.batch_size]
        micro = [ids[i:i + s.micro_batch_size] for i in range(0, len(ids), s.micro_batch_size)]
        totals: dict = {}  # device tensors, read once the step's passes are queued
        mine = [(j, m) for j, m in enumerate(micro) if j % world == rank]
        weight = world / len(ids)
        if not mine:  # fewer micro-batches than processes: a zero-weight pass keeps DDP's gradient sync in step
            mine, weight = [(len(micro) - 1, micro[-1])], 0.0
        # One autocast region for the step's micro-batches: its cache keeps each trained weight's cast copy
        # until the region ends, and the weights change only at the optimizer step. With a region per
        # micro-batch, every weight was cast again for each one: an H200 step's copy kernels were mostly such
        # casts (bench/results/h200). Everything after the forward runs at full precision, as it did outside
        # the region, so the gradients are the same bits.
        with precision.autocast():
            for n_done, (j, m) in enumerate(mine):
                batch = make_batch(train[np.sort(m)], training.generator(s.seed, step, j))
                batch = training.to_device(batch, accelerator.device)
                torch.manual_seed(training.step_seed(s.seed, step, j))  # dropout of micro-batch j, on any process
                sync = n_done == len(mine) - 1
                with accelerator.no_sync(model) if not sync else contextlib.nullcontext():
                    out = forward(**batch)
                    with precision.paused():
                        loss = weighted_loss(out, s.loss_weights) * (len(m) * weight)
                        accelerator.backward(precision.scale(loss))
                        _add(totals, "loss", out["loss"].detach())  # a zero-weight pass's too: its gradient is summed
                        if weight:
                            _sum_counts(out, totals)
        counts = read_counts(totals, s.losses, accelerator.device, accelerator)
        # Checked over every process's passes before the optimizer step: a non-finite loss anywhere stops
        # all of them, and the weights and the last checkpoint stay as they were.
        training.check_finite(torch.tensor(counts.pop("loss")), step, "adapt")
        precision.step(optimizer, model.parameters(), MAX_GRAD_NORM, clip=accelerator.clip_grad_norm_)
        schedule.step()
        optimizer.zero_grad(set_to_none=True)

        metrics = summarize(counts)
        history.append(metrics)
        rates.append(schedule.get_last_lr()[0])
        bar.set_postfix({k: f"{v:.3f}" for k, v in metrics.items() if k.endswith("_loss")})
        if log is not None and accelerator.is_main_process:
            log({**metrics, "lr": rates[-1]}, step)
        if checkpoints.step_done(step + 1, saves=accelerator.is_main_process, history=history, rates=rates):
            break
    accelerator.wait_for_everyone()

    tail = history[-max(1, len(history) // 10):]
    final = {f"train_{k}": float(np.mean([h[k] for h in tail if k in h])) for k in tail[-1]}
    first = {f"first_{k}": v for k, v in history[0].items()}
    result = {**final, **first, "steps": len(history), "device": training.device_name(accelerator.device),
              "precision": precision.name, "processes": accelerator.num_processes, "seconds": round(time.time() - t0, 1)}
    valid_metrics = evaluate(accelerator.unwrap_model(model), valid, make_batch, s, accelerator.device, precision.autocast)
    result.update({f"valid_{k}": v for k, v in valid_metrics.items()})
    return result

