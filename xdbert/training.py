"""Pieces every training loop here shares: optimizer, schedule, precision, NaN guard, checkpoints.

Randomness is a pure function of (seed, step): the data order of an epoch, the masking of a step and
dropout are all re-seeded from them. A run that is killed and resumed from a checkpoint therefore
takes exactly the steps an uninterrupted run takes, and ends with the same weights.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch
from transformers import get_linear_schedule_with_warmup

from xdbert import io
from xdbert.errors import PipelineError
from xdbert.precisions import PRECISIONS


def step_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed derived from the run seed and the position in training (epoch, step, ...)."""
    h = hashlib.sha256(json.dumps([seed, *parts]).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def generator(seed: int, *parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(step_seed(seed, *parts))


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(step_seed(seed, epoch)).permutation(n)


def optimizer_and_schedule(
    model: torch.nn.Module, lr: float, weight_decay: float, warmup_ratio: float, total_steps: int,
    param_groups: list[dict] | None = None,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW without decay on biases and LayerNorms, linear warmup then linear decay to 0."""
    if param_groups is None:
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 else decay).append(p)
        param_groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for all tensors; on CPU it cut the optimizer from 11 to 3 ms of a tiny model's 80 ms step
    optimizer = torch.optim.AdamW(param_groups, lr=lr, fused=True)
    warmup = math.ceil(warmup_ratio * total_steps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def mixed_precision(setting: str, device: str | torch.device) -> str:
    """The precision a run on `device` computes in.

    `auto` is bf16 where the GPU computes it natively (compute capability 8.0+: A100, H100), fp16 with
    loss scaling where it does not (V100, T4: the paper's own GPUs), and full precision on the CPU,
    where bf16 and fp16 matmuls are slow on most CPUs."""
    if setting not in PRECISIONS:
        raise ValueError(f"unknown precision {setting!r}; allowed: {', '.join(PRECISIONS)}")
    if setting != "auto":
        return setting
    device = torch.device(device)
    if device.type != "cuda":
        return "no"
    return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"


def compiles(setting: bool | str, device: str | torch.device) -> bool:
    """Whether a run with `compile: setting` (xdbert.params.compile_setting) compiles its model on `device`."""
    return setting is True or (setting == "auto" and torch.device(device).type == "cuda")


class Precision:
    """Autocast and, for fp16, loss scaling for one training loop, the same code on a GPU and on a CPU.

    fp16's narrow range underflows small gradients to 0, so the loss is scaled up before backward, the
    gradients are unscaled before clipping, and a step whose gradients overflowed is skipped with a
    smaller scale (torch's GradScaler). bf16 has fp32's range and needs none of it.
    """

    def __init__(self, setting: str, device: str | torch.device):
        self.device = torch.device(device)
        self.name = mixed_precision(setting, self.device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.name == "fp16")

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def paused(self):
        """Full precision inside an autocast region, which keeps the region's cache of cast weights."""
        return torch.autocast(self.device.type, enabled=False)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on."""
        return self.scaler.scale(loss)

    def step(self, optimizer: torch.optim.Optimizer, parameters, max_grad_norm: float, clip=None) -> None:
        """Unscale, clip to `max_grad_norm` (with `clip`, e.g. accelerate's, or torch's) and step."""
        self.scaler.unscale_(optimizer)
        (clip or torch.nn.utils.clip_grad_norm_)(parameters, max_grad_norm)
        self.scaler.step(optimizer)
        self.scaler.update()


def to_device(batch: dict, device: str | torch.device) -> dict[str, torch.Tensor]:
    """A batch of tensors or numpy arrays on `device`. To a GPU through pinned memory, without waiting: a
    copy from pageable memory first waits for every kernel already queued, which leaves the GPU idle
    while the host sets up the next step."""
    batch = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
    if torch.device(device).type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def device_name(device: str | torch.device) -> str:
    """What a run computed on, for its metrics. `cpu` alone: every x86-64 CPU writes the same bytes
    (xdbert.numerics), and which one ran goes to the run log. A GPU's bytes repeat on one GPU type and
    software stack only (bench/results/h200), so its name and versions are part of the result."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return f"cuda: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def check_finite(loss: torch.Tensor, step: int, where: str) -> None:
    if not torch.isfinite(loss).all():
        raise PipelineError(
            f"{where}: the loss became {loss.item()} at step {step}; stopping before it spoils the weights. "
            "Lower the learning rate or check the input data; the last checkpoint is kept"
        )


def content_digest(obj: object) -> str:
    """sha256 of a checkpoint's contents: tensors and arrays by their bytes, containers in key order."""
    h = hashlib.sha256()

    def visit(x: object) -> None:
        if isinstance(x, dict):
            for key in sorted(x, key=str):
                h.update(f"<{key!s}>".encode())
                visit(x[key])
        elif isinstance(x, (list, tuple)):
            h.update(f"[{len(x)}".encode())
            for item in x:
                visit(item)
        elif isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(x.shape)}".encode() + t.view(torch.uint8).numpy().tobytes())
        elif isinstance(x, np.ndarray):
            h.update(f"{x.dtype}{x.shape}".encode() + np.ascontiguousarray(x).tobytes())
        else:
            h.update(repr(x).encode())

    visit(obj)
    return h.hexdigest()


def save_checkpoint(path: Path, state: dict, fingerprint: str, shared: bool = False) -> None:
    """Save training state atomically; `fingerprint` ties it to the settings that produced it, and the
    digest of its contents lets a load tell a damaged file (torch.load reads a flipped byte in a
    tensor's data without complaint) from a good one. `shared`: other processes may save it at once
    (`io.atomic_path`)."""
    with io.atomic_path(path, shared=shared) as tmp:
        torch.save({"fingerprint": fingerprint, "sha256": content_digest(state), **state}, tmp)


def load_checkpoint(path: Path, fingerprint: str) -> dict | None:
    """The saved state if it exists and was made with the same settings, else None (start afresh).

    A damaged checkpoint is an error, not a silent restart: resuming from it would train on wrong
    weights, and starting over unasked could throw away days of a paper-profile run."""
    if not path.is_file():
        return None
    damaged = f"checkpoint {path} is damaged"
    remedy = f"delete it (rm {path}) to start this run afresh, or restore it from a backup"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise PipelineError(f"{damaged} or from another torch version ({type(e).__name__}: {e}); {remedy}") from e
    if not isinstance(saved, dict) or "sha256" not in saved:
        raise PipelineError(f"{damaged}: it holds no content digest; {remedy}")
    state = {k: v for k, v in saved.items() if k not in ("fingerprint", "sha256")}
    if saved.get("fingerprint") != fingerprint:
        print(f"note: {path} was made with other settings or inputs; starting afresh")
        return None
    if content_digest(state) != saved["sha256"]:
        raise PipelineError(f"{damaged}: its contents do not match the digest saved with them; {remedy}")
    return state


class Checkpoints:
    """A step loop's resume, periodic checkpoint and early stop, the same for each loop that keeps a
    checkpoint (pretraining's stand-ins, adaptation).

    `parts` are what the loop saves by their state dicts (model, optimizer, schedule, ...), under those
    names; with them a checkpoint holds the steps `done` and the loop's own records (its history).
    `stop_after` ends a run early after that many steps (tests use it to simulate a kill).
    """

    def __init__(self, path: Path, fingerprint: str, parts: dict, every: int, total: int,
                 stop_after: int | None = None):
        self.path, self.fingerprint, self.parts = path, fingerprint, parts
        self.every, self.total, self.stop_after = every, total, stop_after

    def resume(self, say=print) -> dict | None:
        """The saved state, with every part loaded from it, if the checkpoint matches; else None. `say`
        prints the line that says so (a run of several processes passes accelerate's, which prints once)."""
        state = load_checkpoint(self.path, self.fingerprint)
        if state is not None:
            for name, part in self.parts.items():
                part.load_state_dict(state[name])
            say(f"resuming from {self.path} at step {state['step']}/{self.total}")
        return state

    def step_done(self, done: int, saves: bool = True, **records) -> bool:
        """After the loop's `done`-th step: save every `every` steps and at the last (where `saves`: one
        process of several), and say whether to stop here."""
        if saves and (done % self.every == 0 or done == self.total):
            parts = {name: part.state_dict() for name, part in self.parts.items()}
            save_checkpoint(self.path, {**parts, "step": done, **records}, self.fingerprint)
        return self.stop_after is not None and done >= self.stop_after


def model_identity(model: torch.nn.Module) -> tuple[list, str]:
    """Names and shapes of the model's tensors and a sha256 of their values (call it before training).

    Part of the checkpoint fingerprint: the checkpoint lives outside DVC's outputs, so after a killed run
    a change of `model.seed`, the encoder or its size must start afresh instead of resuming (or failing
    to load with a size-mismatch traceback).
    """
    h = hashlib.sha256()
    shapes = []
    for name, t in model.state_dict().items():
        shapes.append([name, list(t.shape)])
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return shapes, h.hexdigest()


def fingerprint(*objs: object) -> str:
    return hashlib.sha256(json.dumps(objs, sort_keys=True, default=str).encode()).hexdigest()[:16]
