"""What decides a run's result, as the key the run cache keeps it under.

A run's result depends on the code it runs, the model's files, the tokenized task, the settings its kind
reads, its seed, the seeds stacked with it (`groups`: their dropout draws share one stream) and the kind
of device. The code is this subpackage's: every module of `xdbert.finetuning.compute` and what they import
(`xdbert.imports.closure`), which holds no params, paths or scheduling (tests/test_finetuning_layers.py), so
an edit to how runs are scheduled, logged or kept keeps every saved run.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

import numpy as np
import torch

from xdbert import imports, training
from xdbert.data.shards import sha256_file
from xdbert.finetuning.compute.job import Job
from xdbert.finetuning.compute.stacked import Group


def groups(job: Job, seeds: list[int]) -> list[Group]:
    """The job's seeds in groups of `stack`, in the given order (the last group may be smaller)."""
    k = job.hyperparameters.stack
    return [tuple(seeds[i:i + k]) for i in range(0, len(seeds), k)]


# Settings a kind of model never reads: the encoder's own config sets its dropout, and it reads no CLIP
# blocks. Changing one of them must not retrain Table 1's encoder runs, the bulk of the grid.
NOT_READ = {"encoder": ("dropout", "clip_blocks_per_sentence")}


def run_key(job: Job, seed: int, device: str, group: Group | None = None) -> str:
    """What decides a run's result (`Job.identity` covers the code, model files and data; the settings its
    kind reads), as a file name; `device` as `training.device_name` gives it; `group`, the seeds stacked
    with it, where there are any."""
    read = {k: v for k, v in dataclasses.asdict(job.hyperparameters).items() if k not in NOT_READ.get(job.model_kind, ())}
    stacked = [list(group)] if group and len(group) > 1 else []
    return training.fingerprint(job.identity, read, seed, device, *stacked)


def code_files(root: Path = imports.ROOT) -> list[Path]:
    """The code a run executes: every module of this subpackage under `root` (the folder that holds the
    package) and the modules they import, and the source of the MKL library that picks the CPU's kernels
    (xdbert.numerics)."""
    package = root / imports.PACKAGE
    modules = sorted((package / "finetuning" / "compute").glob("*.py"))
    return sorted(set().union(*(imports.closure(m, root) for m in modules)) | {package / "mkl_dispatch.c"})


def code_digest(root: Path = imports.ROOT) -> str:
    """A hash of `code_files` and the versions of torch and transformers. A change to any of them makes
    every saved run stale; one to the grid, a report, an analysis or the adaptation does not."""
    return _code_digest(root)


@functools.cache
def _code_digest(root: Path) -> str:
    """`code_digest`, computed once per process and root, however the root is passed."""
    import transformers

    h = hashlib.sha256(f"torch {torch.__version__} transformers {transformers.__version__}\n".encode())
    for path in code_files(root):
        h.update(f"{path.relative_to(root)}:{sha256_file(path)}\n".encode())
    return h.hexdigest()[:16]


@functools.cache
def _file_digest(path: Path, inode: int, size: int, mtime_ns: int) -> str:
    """A file's sha256, read once per (inode, size, mtime), as DVC's own state keeps it: every task's jobs
    hash the same model folders, gigabytes in the paper profile."""
    return sha256_file(path)


def job_identity(job: Job, root: Path = imports.ROOT) -> str:
    """A hash of what a run's result depends on besides the hyperparameters and the seed: the code (under
    `root`), the model kind, the task, every file of the model folder and the tokenized data. A saved run is
    reused only if it matches."""
    h = hashlib.sha256(f"{code_digest(root)} {job.model_kind} {job.spec.name} {job.eot_id}\n".encode())
    folder = Path(job.model_path)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        st = path.stat()
        h.update(f"{path.relative_to(folder)}:{_file_digest(path, st.st_ino, st.st_size, st.st_mtime_ns)}\n".encode())
    for split in sorted(job.data):
        d = job.data[split]
        arrays = [d.idx, d.labels, *(a for name in sorted(d.inputs) for a in (d.inputs[name].flat, d.inputs[name].offsets))]
        for a in arrays + ([] if d.clip_ids is None else [d.clip_ids]):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]
