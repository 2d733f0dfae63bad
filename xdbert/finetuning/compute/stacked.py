"""Several seeds of one job trained as one model: every call runs all of them (`finetune.stack`).

On a GPU a base model's step on 32 short examples is bound by launching ~1,200 small kernels, not by
arithmetic: runs taking turns on one GPU saturate at a few runs (bench/results/h200). Here K seeds'
weights are stacked along a new leading dimension (`torch.func.stack_module_state`) and one call,
vmapped over that dimension, computes all K models on their own batches: each kernel does K runs' work
(a batched matrix product instead of K small ones), so a step's kernel count no longer grows with K.

Each seed keeps what makes it a seed: its head's initial weights, its batch order, its own loss,
gradient-norm clipping and AdamW state (AdamW is elementwise, so one optimizer over stacked tensors
updates each seed exactly as its own would). What it shares is the dropout stream: the masks of a step
are drawn for the K seeds together, seeded from the whole stack and the step. So a seed's result depends
on the seeds stacked with it, and `stack` is part of every run's settings (and of its key in the run
cache), as `compile` is. With dropout off, a stacked seed computes what `loop.train_seed` computes for it,
up to float rounding (tests/test_stacked.py).

The seeds' batches of a step may differ in size (the last batch of an epoch lands at a different step
for each seed) and in length; they are padded to the largest, the padding rows copies of a real row
that weigh 0 in the loss, so they add no gradient.
"""
from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import sdpa_mask

from xdbert import training
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute import graphed
from xdbert.finetuning.compute.heads import mask_always_applied
from xdbert.finetuning.compute.job import Job, build_model
from xdbert.finetuning.compute.loop import epoch_loss, pad_multiple, seed_result, stepping, task_loss, train_seed
from xdbert.finetuning.compute.rates import parameter_groups

# Compiled, a stacked model is compiled anew for each batch shape: vmap's batching rules (layer norm's)
# fix the sequence length in the graph, where the unstacked model keeps one graph for every length. So
# lengths are rounded up to buckets of 32 tokens (4 graphs up to 128) and batches filled to full size.
LENGTH_BUCKET = 32
Group = tuple[int, ...]  # seeds trained together (`finetune.stack` of them, the last group maybe fewer)
STACKED_ATTENTION = "xdbert_stacked"  # the attention implementation a stack's template runs


def matmul_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention as two matrix products and a softmax, registered for stacked models: the scores of
    transformers' `eager` attention, bit for bit. SDPA's fused kernels have no batching rule under vmap,
    and on a GPU the compiled memory-efficient backward rejects vmap's layout. The mask is SDPA's boolean
    one (True: attend), filled in rather than added: transformers' additive `eager` mask copied a host
    scalar to the GPU before 5.21, which a CUDA graph cannot record."""
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = nn.functional.dropout(scores.softmax(-1), p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


AttentionInterface.register(STACKED_ATTENTION, matmul_attention)
AttentionMaskInterface.register(STACKED_ATTENTION, sdpa_mask)


class StackedModel(nn.Module):
    """K copies of one architecture as one module: `forward(batch) -> scores (K, B, outputs)`.

    The stacked weights are this module's own parameters (so torch.compile and CUDA graphs treat them as
    the static weights they are); `template` is the architecture without storage, called functionally
    with each seed's slice. Eagerly, transformers' check whether a batch has padding at all (to drop the
    attention mask) is turned off: it reads the mask's values on the host, which a vmapped call cannot; the
    mask is then always applied, which gives the same scores.
    """

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        params, buffers = stack_module_state(models)
        self.names = list(params)
        self.weights = nn.ParameterList(nn.Parameter(params[n].detach(), requires_grad=params[n].requires_grad)
                                        for n in self.names)
        self.buffer_names = list(buffers)
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"buffer_{i}", buffers[name], persistent=False)
        template = copy.deepcopy(models[0])
        template.model.set_attn_implementation(STACKED_ATTENTION)
        # not a submodule: its meta tensors must not show up among this module's parameters
        self.__dict__["template"] = template.to("meta")
        self.k = len(models)

    def named_stacked(self) -> dict[str, nn.Parameter]:
        """The stacked weights by the name each has in one model."""
        return dict(zip(self.names, self.weights))

    def train(self, mode: bool = True) -> "StackedModel":
        self.template.train(mode)  # dropout reads the template's mode
        return super().train(mode)

    def forward(self, batch: dict[str, torch.Tensor], shared: bool = False) -> torch.Tensor:
        """Scores of each seed's model on its own batch (tensors (K, B, ...)), or with `shared` on one
        batch for all (tensors (B, ...), as in evaluation)."""
        params = self.named_stacked()
        buffers = {n: getattr(self, f"buffer_{i}") for i, n in enumerate(self.buffer_names)}

        def one(p, b, x):
            return functional_call(self.template, (p, b), (x,))

        call = vmap(one, in_dims=(0, 0, None if shared else 0), randomness="different")
        if torch.compiler.is_compiling():  # transformers skips the check itself while compiling
            return call(params, buffers, batch)
        with mask_always_applied():
            return call(params, buffers, batch)


def clip_per_seed(parameters, max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for each seed of stacked gradients: every seed's gradient norm
    (over all its tensors) is clipped to `max_norm` alone. Returns the K norms."""
    grads = [p.grad for p in parameters if p.grad is not None]
    # Each seed's slices of every gradient, so that the multi-tensor kernels torch's own clipping uses
    # (one launch for many tensors) serve here too: a few launches per seed, not several per tensor.
    per_seed = [[g[k] for g in grads] for k in range(grads[0].shape[0])]
    norms = torch.stack([torch.linalg.vector_norm(torch.stack(torch._foreach_norm(views)).float())
                         for views in per_seed])
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for k, views in enumerate(per_seed):
        torch._foreach_mul_(views, coef[k].to(views[0].dtype))
    return norms


def stack_batches(data: fd.Encoded, rows: list[np.ndarray], multiple: int,
                  size: int = 0) -> tuple[dict[str, np.ndarray], list[int]]:
    """The K seeds' batches as one: arrays (K, B, ..., L) at the largest length and batch size (or `size`
    where larger). Sequences are padded with each input's pad id (mask 0); missing rows repeat the seed's
    first row. Returns the batch and each seed's real row count."""
    batches = [fd.collate(data, r, multiple) for r in rows]
    sizes = [len(r) for r in rows]
    size = max(size, *sizes)
    pads = {**data.pad_ids, "attention_mask": 0}
    length = max(b["attention_mask"].shape[-1] for b in batches)
    out = {}
    for key in batches[0]:
        arrays = []
        for b, n in zip(batches, sizes):
            a = b[key]
            if key in pads:
                widths = [(0, 0)] * (a.ndim - 1) + [(0, length - a.shape[-1])]
                a = np.pad(a, widths, constant_values=pads[key])
            arrays.append(np.concatenate([a, np.repeat(a[:1], size - n, axis=0)]) if n < size else a)
        out[key] = np.stack(arrays)
    return out, sizes


@torch.no_grad()
def predict_stacked(model: nn.Module, k: int, job: Job, data: fd.Encoded, multiple: int, device: torch.device,
                    autocast) -> list[np.ndarray]:
    """The K seeds' predictions on a split (as `loop.predict`), each batch computed once for all seeds."""
    model.eval()
    out: list[np.ndarray] = []
    for rows in fd.eval_batches(data.lengths, job.hyperparameters.eval_batch_size):
        batch = training.to_device(fd.collate(data, rows, multiple), device)
        batch.pop("labels")
        with autocast():
            scores = model(batch, shared=True).float()
        if job.spec.kind == "regression":
            values = scores.reshape(k, -1).double().cpu().numpy()
        else:
            values = scores.argmax(-1).cpu().numpy().astype(np.int64)
        if not out:
            out = [np.zeros(len(data), dtype=values.dtype) for _ in range(k)]
        for seed_out, v in zip(out, values):
            seed_out[rows] = v
    model.train()
    return out


def train_stack(job: Job, seeds: list[int], device: str | torch.device = "cpu") -> list[dict]:
    """Finetune fresh copies of the model for `seeds` as one stacked model; evaluate each on every dev
    split. Returns one result per seed, as `loop.train_seed` does, each naming the seeds it was stacked with
    (`stacked_with`); their times are the stack's."""
    s, spec = job.hyperparameters, job.spec
    if job.model_kind != "encoder":
        raise PipelineError(f"finetune.stack > 1 trains `encoder` models only, not `{job.model_kind}`: its shapes "
                            "follow each batch's CLIP blocks, and a vmapped call needs one shape for every seed")
    device = torch.device(device)
    t0 = time.time()
    models = []
    for seed in seeds:
        torch.manual_seed(training.step_seed(seed, -1))  # each seed's head, as in train_seed
        models.append(build_model(job))
    groups = parameter_groups(models[0], s.lr, s.weight_decay, s.layer_lr_decay)
    model = StackedModel(models).to(device)
    del models
    model.train()
    stacked = model.named_stacked()
    for g in groups:  # the same groups as one model's: weight decay by each tensor's own rank
        g["params"] = [stacked[n] for n in g.pop("names")]
    train = job.data["train"]
    total = math.ceil(len(train) / s.batch_size) * s.epochs
    optimizer, schedule, precision, compiling, recorded, forward = stepping(model, s, device, total, groups)

    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One step of every seed; their K losses. `weights` (K, B) is 1 / rows on a seed's real rows and 0 on
        its padding rows, so each seed's loss is the mean over its real rows, in one set of kernels for the
        whole stack. The sum's gradient is each seed's own."""
        inputs = {name: t for name, t in batch.items() if name not in ("labels", "weights")}
        with precision.autocast():
            scores = forward(inputs)
        rows_loss = task_loss(spec, scores.flatten(0, 1), batch["labels"].flatten(0, 1), reduction="none")
        loss = (rows_loss.view(batch["weights"].shape) * batch["weights"]).sum(1)
        precision.scale(loss.sum()).backward()
        precision.step(optimizer, model.parameters(), s.max_grad_norm, clip=clip_per_seed)
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    run_step = graphed.GraphedStep(train_step, optimizer, recorded)

    where = f"finetune {job.model_kind} {Path(job.model_path).name} {spec.name} seeds {seeds} (stacked)"
    multiple, size = pad_multiple(s.max_len, device), 0
    if compiling and s.max_len % LENGTH_BUCKET == 0:
        multiple, size = LENGTH_BUCKET, s.batch_size
    epoch_losses, step = [], 0
    t_train = time.time()
    for epoch in range(s.epochs):
        losses = []
        orders = [fd.length_grouped_batches(train.lengths, s.batch_size, seed, epoch, s.length_group) for seed in seeds]
        for rows in zip(*orders):
            arrays, sizes = stack_batches(train, list(rows), multiple, size)
            width = arrays["labels"].shape[1]
            arrays["weights"] = np.array([[1.0 / n] * n + [0.0] * (width - n) for n in sizes], dtype=np.float32)
            batch = training.to_device(arrays, device)
            torch.manual_seed(training.step_seed(seeds, -2, step))  # the stack's dropout of this step
            if compiling and not recorded:
                torch.compiler.cudagraph_mark_step_begin()
            losses.append(run_step(batch))
            schedule.step()
            step += 1
        per_seed = torch.stack(losses).unbind(1)
        epoch_losses.append([epoch_loss(list(x.unbind()), step, f"{where}, seed {seed}")
                             for x, seed in zip(per_seed, seeds)])

    t_eval = time.time()
    predictions: list[dict] = [{} for _ in seeds]
    for split in job.dev_splits:
        data = job.data[split]
        # Evaluated uncompiled (so padded as an eager run is): compiled, every length bucket and the last,
        # smaller batch of each split would be one more graph to compile (tens of seconds each at base
        # size), for one pass of a dev set.
        for i, pred in enumerate(predict_stacked(model, len(seeds), job, data, pad_multiple(s.max_len, device),
                                                 device, precision.autocast)):
            predictions[i][split] = pred
    return [seed_result(job, seed, device, precision.name, predictions[i], [e[i] for e in epoch_losses], step,
                         (t0, t_train, t_eval), stacked_with=list(seeds))
            for i, seed in enumerate(seeds)]


def train_group(job: Job, group: Group, device: str | torch.device = "cpu") -> list[dict]:
    """A group's results in seed order: one seed alone (`loop.train_seed`), several as one stacked model."""
    if len(group) == 1:
        return [train_seed(job, group[0], device)]
    return train_stack(job, list(group), device)
