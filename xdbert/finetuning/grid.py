"""Every (job, seed) of a task in one pool of worker processes, and a cache of finished runs.

With `Job.run_cache` set, each finished run is saved there under a key of exactly what decided it: the
code, the model's files, the tokenized task, the hyperparameters, the seed and the kind of device. DVC
reruns a whole `finetune@<task>` stage when any of its models changes, and a killed stage is rerun
whole too; either way, a run whose key is saved is read back instead of trained, so only the changed
runs train (a new adaptation variant's, say). A fresh clone starts with an empty cache.
"""
from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import multiprocessing
import os
from pathlib import Path

import torch

from xdbert import training
from xdbert.numerics import FINETUNING_THREADS
from xdbert.errors import PipelineError
from xdbert.finetuning.job import Job
from xdbert.finetuning.loop import train_seed


# How many runs go at once is the machine's business, not the study's: an environment variable, never a
# param or an output byte (a run's thread count is fixed, so its bytes do not depend on it either).
WORKERS_ENV = "XDBERT_FINETUNE_WORKERS"
# Runs sharing one GPU. A base-model run at GLUE lengths leaves an H100 or H200 mostly idle: 4 runs sharing
# one gave 3.35x the tokens/s of 1, 8 gave 4.21x, each needing about 1.9 GiB (bench/results/h200). `auto`
# takes 8 where the memory holds 8 runs of GIB_PER_RUN, fewer on a smaller GPU.
RUNS_PER_GPU_ENV = "XDBERT_RUNS_PER_GPU"
MAX_RUNS_PER_GPU = 8
GIB_PER_RUN = 2.5  # the measured 1.9 GiB of a BERT-base run, with room for longer batches

_worker_device = "cpu"  # set in each pool worker by `_init_worker`
_worker_jobs: list[Job] = []


def _init_worker(jobs: list[Job], devices, threads: int) -> None:
    """Pool worker start: take the jobs once (inherited under fork, pickled once under spawn), claim a device."""
    global _worker_device, _worker_jobs
    _worker_jobs, _worker_device = jobs, devices.get()
    if threads:
        torch.set_num_threads(threads)


def _train_in_worker(index: int, seed: int) -> dict:
    return train_or_resume(_worker_jobs[index], seed, _worker_device)


def run_key(job: Job, seed: int, device: str | torch.device) -> str:
    """What decides a run's result (`Job.identity` covers the code, model files and data), as a file name."""
    return training.fingerprint(job.identity, dataclasses.asdict(job.hyperparameters), seed, training.device_name(device))


def train_or_resume(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """`train_seed`, or the result of the same run saved in `job.run_cache`; `reused` says which.

    A paper-profile grid runs for days: a kill should cost the runs in flight, and a change to one
    model the runs of that model, not the finished ones.
    """
    if not job.run_cache:
        return {**train_seed(job, seed, device), "reused": False}
    key = run_key(job, seed, device)
    path = Path(job.run_cache) / f"{key}.pt"
    state = training.load_checkpoint(path, key)
    if state is not None:
        return {**state["result"], "reused": True}
    result = train_seed(job, seed, device)
    training.save_checkpoint(path, {"result": result}, key)
    return {**result, "reused": False}


def _count_from_env(name: str, auto: str) -> int | str:
    value = os.environ.get(name, "auto").strip()
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise PipelineError(f"{name}={value!r} must be a positive number, or auto ({auto})")
    return int(value)


def workers_from_env() -> int | str:
    """`XDBERT_FINETUNE_WORKERS`: a positive number, or `auto` (the default): every GPU's share of runs, or
    one worker per core on a CPU."""
    return _count_from_env(WORKERS_ENV, "every GPU's runs, or one worker per core on a CPU")


def runs_per_gpu(device: int) -> int:
    """`XDBERT_RUNS_PER_GPU`, or for `auto` as many runs as GPU `device`'s memory holds, at most 8."""
    chosen = _count_from_env(RUNS_PER_GPU_ENV, f"up to {MAX_RUNS_PER_GPU}, as the GPU's memory allows")
    if chosen != "auto":
        return chosen
    gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    return max(1, min(MAX_RUNS_PER_GPU, int(gib // GIB_PER_RUN)))


def plan_workers(n_runs: int, workers: int | str) -> tuple[list[str], int]:
    """(device of each worker, torch threads per worker; 0 = leave torch's setting alone).

    GPUs: `runs_per_gpu` workers on each GPU, taken GPU by GPU in turn (at most `workers` in all when it is
    a number). CPU: `workers` processes (auto = one per core) of one thread each: small models train
    faster as several one-thread processes than as one process with several threads, and a run's bytes
    must not depend on how many workers shared the machine (xdbert.numerics). Never more than `n_runs`.
    """
    n_gpus = torch.cuda.device_count()
    if n_gpus:
        shares = [runs_per_gpu(i) for i in range(n_gpus)]
        slots = [f"cuda:{i}" for k in range(max(shares)) for i in range(n_gpus) if k < shares[i]]
        n = len(slots) if workers == "auto" else min(int(workers), len(slots))
        return slots[:max(1, min(n, n_runs))], 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = cores if workers == "auto" else int(workers)
    return ["cpu"] * max(1, min(n, n_runs)), FINETUNING_THREADS


def _cost(job: Job) -> tuple[int, int]:
    """Sort key, largest first: the full model costs several encoders, then the training tokens decide."""
    train = job.data["train"]
    size = sum(int(r.offsets[-1]) for r in train.inputs.values()) + (0 if train.clip_ids is None else train.clip_ids.size)
    return ({"full": 2, "clip": 1}.get(job.model_kind, 0), size)


def run_grid(work: list[tuple[Job, list[int]]], workers: int | str = 1) -> list[list[dict]]:
    """`train_or_resume` for every (job, seed) of `work`; per job, its results in seed order.

    All runs share one pool and a free worker takes the next run, longest first, so no worker waits
    while another still has several seeds of its share to go (a task's runs differ up to 5x in cost).
    """
    runs = [(i, seed) for i, (_, seeds) in enumerate(work) for seed in seeds]
    if any(not seeds for _, seeds in work):
        raise PipelineError("no seeds to run: `finetune.seeds` (and `finetune.rte_seeds` for RTE) must list at least one")
    jobs = [job for job, _ in work]
    devices, threads = plan_workers(len(runs), workers)
    if len(devices) == 1:
        before = torch.get_num_threads()
        torch.set_num_threads(threads or before)
        try:
            done = {(i, seed): train_or_resume(jobs[i], seed, devices[0]) for i, seed in runs}
        finally:
            torch.set_num_threads(before)
    else:
        # fork shares the tokenized data without copying; CUDA cannot be used after a fork, so GPUs spawn.
        context = multiprocessing.get_context("spawn" if devices[0].startswith("cuda") else "fork")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the parent's tokenizer is not used after the fork
        free_devices = context.Queue()
        for device in devices:
            free_devices.put(device)
        runs.sort(key=lambda run: _cost(jobs[run[0]]), reverse=True)
        with futures.ProcessPoolExecutor(len(devices), mp_context=context, initializer=_init_worker,
                                         initargs=(jobs, free_devices, threads)) as pool:
            pending = {run: pool.submit(_train_in_worker, *run) for run in runs}
            done = {run: f.result() for run, f in pending.items()}
    return [[done[(i, seed)] for seed in seeds] for i, (_, seeds) in enumerate(work)]


def run_seeds(job: Job, seeds: list[int], workers: int | str = 1) -> list[dict]:
    """`train_seed` for every seed of one job (see `run_grid`); results in seed order."""
    return run_grid([(job, list(seeds))], workers)[0]
