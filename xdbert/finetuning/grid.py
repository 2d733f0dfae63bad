"""The finetuning grid: every (job, seed) run of the study in flight at once, and a cache of finished runs.

The runs go to Ray workers (xdbert.finetuning.engine) longest first, so no worker idles while another
still has several runs of its share to go (a task's runs differ up to 5x in cost, tasks far more).

With `Job.run_cache` set, the stage's process keeps every finished run there under a key of exactly what
decided it: the code, the model's files, the tokenized task, the hyperparameters, the seed and the kind
of device. DVC reruns the grid stage when any of its inputs changes, and a killed stage is rerun whole;
either way, a run whose key is saved is read back instead of trained, so only the changed runs train (a
new adaptation variant's, say) and a kill costs only the runs in flight. A fresh clone starts with an
empty cache. When every run is in the cache, Ray is not started at all.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from xdbert import training
from xdbert.errors import PipelineError
from xdbert.finetuning.job import Job
from xdbert.finetuning.loop import train_seed
from xdbert.numerics import FINETUNING_THREADS


def run_key(job: Job, seed: int, device: str) -> str:
    """What decides a run's result (`Job.identity` covers the code, model files and data), as a file name;
    `device` as `training.device_name` gives it."""
    return training.fingerprint(job.identity, dataclasses.asdict(job.hyperparameters), seed, device)


def cache_entry(job: Job, seed: int, device: str) -> tuple[Path, str]:
    """(file, key) of a run in `job.run_cache`."""
    key = run_key(job, seed, device)
    return Path(job.run_cache) / f"{key}.pt", key


def cached(job: Job, seed: int, device: str) -> dict | None:
    """The result of the same run on `device`, saved in `job.run_cache`, or None."""
    if not job.run_cache:
        return None
    state = training.load_checkpoint(*cache_entry(job, seed, device))
    return None if state is None else {**state["result"], "reused": True}


def keep(job: Job, seed: int, result: dict) -> dict:
    """Save a run just trained in `job.run_cache`, under the device it ran on."""
    if job.run_cache:
        path, key = cache_entry(job, seed, result["device"])
        training.save_checkpoint(path, {"result": result}, key)
    return {**result, "reused": False}


def _local_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def train_or_resume(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """`train_seed` in this process, or the result of the same run saved in `job.run_cache`; `reused`
    says which."""
    return cached(job, seed, training.device_name(device)) or keep(job, seed, train_seed(job, seed, device))


def _check(work: list[tuple[Job, list[int]]]) -> None:
    if any(not seeds for _, seeds in work):
        raise PipelineError("no seeds to run: `finetune.seeds` (and `finetune.rte_seeds` for RTE) must list at least one")


def run_seeds(job: Job, seeds: list[int]) -> list[dict]:
    """Every seed of one job in this process, one after another, each with a run's fixed thread count on
    a CPU (what a worker of the grid computes with): for benchmarks and tests. Results in seed order."""
    _check([(job, seeds)])
    device = _local_device()
    before = torch.get_num_threads()
    torch.set_num_threads(FINETUNING_THREADS if device == "cpu" else before)
    try:
        return [train_or_resume(job, seed, device) for seed in seeds]
    finally:
        torch.set_num_threads(before)


def _cost(job: Job) -> tuple[int, int]:
    """Sort key, largest first: the full model costs several encoders, then the training tokens decide."""
    train = job.data["train"]
    size = sum(int(r.offsets[-1]) for r in train.inputs.values()) + (0 if train.clip_ids is None else train.clip_ids.size)
    return ({"full": 2, "clip": 1}.get(job.model_kind, 0), size)


def run_grid(work: list[tuple[Job, list[int]]], workers: int | str = "auto") -> list[list[dict]]:
    """Every (job, seed) of `work`, on Ray workers (`workers`: how many, or auto); per job, its results
    in seed order. Each result says whether it was `reused` from the run cache."""
    _check(work)
    jobs = [job for job, _ in work]
    runs = [(i, seed) for i, (_, seeds) in enumerate(work) for seed in seeds]
    local = training.device_name(_local_device())
    done = {run: result for run in runs if (result := cached(jobs[run[0]], run[1], local)) is not None}
    todo = [run for run in runs if run not in done]
    if todo:
        # Ray only where a grid runs: the benchmarks' single seeds (`run_seeds`) run on machines without it
        from xdbert.finetuning import engine

        started = engine.connect()
        try:
            n, gpu_each = engine.plan(len(todo), workers, engine.run_gib([job.model_path for job in jobs]))
            shared = engine.share(jobs)
            actors = engine.start_workers(n, gpu_each)
            # A cluster's workers may compute on another device than this machine: look again under theirs.
            for device in engine.devices(actors) - {local}:
                done.update({run: result for run in todo
                             if (result := cached(jobs[run[0]], run[1], device)) is not None})
            todo = sorted((run for run in todo if run not in done), key=lambda run: _cost(jobs[run[0]]), reverse=True)
            for i, seed, result in engine.results(actors, shared, todo):
                done[(i, seed)] = keep(jobs[i], seed, result)
        finally:
            if started:
                engine.disconnect()
    return [[done[(i, seed)] for seed in seeds] for i, (_, seeds) in enumerate(work)]
