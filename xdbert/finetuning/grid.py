"""Every (job, seed) of a task in one pool of worker processes, and resuming a killed grid.

With `Job.checkpoint_dir` set, each finished seed is saved there, so a killed grid resumes with the
seeds it had not finished.
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


def train_or_resume(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """`train_seed`, or the result this job and seed already saved in `job.checkpoint_dir`.

    A paper-profile grid runs for days; a kill should cost the seeds in flight, not the finished ones.
    The saved result is tied to the job's identity, hyperparameters and seed, so changed inputs train afresh.
    """
    if not job.checkpoint_dir:
        return train_seed(job, seed, device)
    path = Path(job.checkpoint_dir) / f"seed_{seed}.pt"
    fingerprint = training.fingerprint(job.identity, dataclasses.asdict(job.hyperparameters), seed)
    state = training.load_checkpoint(path, fingerprint)
    if state is not None:
        print(f"resuming from {path}: seed {seed} finished before the stage was stopped")
        return state["result"]
    result = train_seed(job, seed, device)
    training.save_checkpoint(path, {"result": result}, fingerprint)
    return result


def plan_workers(n_runs: int, workers: int | str) -> tuple[list[str], int]:
    """(device of each worker, torch threads per worker; 0 = leave torch's setting alone).

    GPUs: one worker per GPU (at most `workers` when it is a number). CPU: `workers` processes
    (auto = one per core, at most one per run) of one thread each: small models train faster as several
    one-thread processes than as one process with several threads, and a run's bytes must not depend on
    how many workers shared the machine (xdbert.numerics).
    """
    n_gpus = torch.cuda.device_count()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n_gpus:
        n = n_gpus if workers == "auto" else min(int(workers), n_gpus)
    else:
        n = cores if workers == "auto" else int(workers)
    n = max(1, min(n, n_runs))
    devices = [f"cuda:{i}" for i in range(n)] if n_gpus else ["cpu"] * n
    return devices, (0 if n_gpus else FINETUNING_THREADS)


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
