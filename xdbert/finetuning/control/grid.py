"""The finetuning grid: every (job, seed) run of the study in flight at once, and a cache of finished runs.

The runs go to Ray workers (xdbert.finetuning.control.engine) longest first, so no worker idles while another
still has several runs of its share to go (a task's runs differ up to 5x in cost, tasks far more); only each
worker's first run, a cheap one, and a few runs of each model kind go before, so that the log's estimate of
the time left measures them early (xdbert.finetuning.control.progress). With
`finetune.stack` above 1, a job's seeds go in fixed groups of that many, in the order the params list
them, and each group trains as one stacked model (`xdbert.finetuning.compute.stacked`).

With `Job.run_cache` set, the stage's process keeps every finished run there under a key of exactly what
decided it (`xdbert.finetuning.compute.keys`): the code of what a run computes (none of this module's), the
model's files, the tokenized task, the hyperparameters, the seed, the seeds stacked with it and the kind
of device. DVC reruns the grid stage when any of its inputs changes, and a
killed stage is rerun whole; either way, a run whose key is saved is read back instead of trained, so
only the changed runs train (a new adaptation variant's, say) and a kill costs only the runs in flight. A fresh clone starts with an
empty cache. When every run is in the cache, Ray is not started at all.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from xdbert import training
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.job import Job
from xdbert.finetuning.compute.keys import groups, run_key
from xdbert.finetuning.compute.stacked import Group, train_group
from xdbert.finetuning.control import cores
from xdbert.finetuning.control.progress import TICK_S, Progress, probing_order
from xdbert.finetuning.control.sizes import compute_parameters
from xdbert.numerics import FINETUNING_THREADS


def cache_entry(job: Job, seed: int, device: str, group: Group | None = None) -> tuple[Path, str]:
    """(file, key) of a run in `job.run_cache`."""
    key = run_key(job, seed, device, group)
    return Path(job.run_cache) / f"{key}.pt", key


def cached(job: Job, group: Group, device: str) -> list[dict] | None:
    """The results of the group's runs on `device`, saved in `job.run_cache`, or None unless all are."""
    if not job.run_cache:
        return None
    states = [training.load_checkpoint(*cache_entry(job, seed, device, group)) for seed in group]
    return None if any(s is None for s in states) else [{**s["result"], "reused": True} for s in states]


def keep(job: Job, group: Group, results: list[dict]) -> list[dict]:
    """Save a group's runs just trained in `job.run_cache`, under the device they ran on."""
    if job.run_cache:
        for seed, result in zip(group, results):
            path, key = cache_entry(job, seed, result["device"], group)
            training.save_checkpoint(path, {"result": result}, key, shared=True)  # experiments run at once share it
    return [{**result, "reused": False} for result in results]


def _local_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def train_or_resume(job: Job, group: Group, device: str | torch.device = "cpu") -> list[dict]:
    """`train_group` in this process, or the results of the same runs saved in `job.run_cache`; `reused`
    says which."""
    return cached(job, group, training.device_name(device)) or keep(job, group, train_group(job, group, device))


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
        return [result for group in groups(job, seeds) for result in train_or_resume(job, group, device)]
    finally:
        torch.set_num_threads(before)


def cost(job: Job, group: Group) -> float:
    """A run's expected cost, in proportion to its training FLOPs: the model's parameters less its token
    embeddings (`compute_parameters`) times the tokens it trains on (BERT tokens and CLIP ids, every epoch),
    for each seed of the group. The grid orders its runs by it, longest first, and its log estimates a run's
    time from the measured times of runs of about its cost (xdbert.finetuning.control.progress)."""
    train = job.data["train"]
    tokens = sum(int(r.offsets[-1]) for r in train.inputs.values()) + (0 if train.clip_ids is None else train.clip_ids.size)
    return float(compute_parameters(job.model_path)) * tokens * job.hyperparameters.epochs * len(group)


def timed(results: list[dict]) -> float:
    """The seconds a run group took (its seeds trained together, each result saying the group's), 0 if unknown."""
    return float(results[0].get("seconds", 0)) if results else 0.0


def run_grid(work: list[tuple[Job, list[int]]], workers: int | str = "auto",
             finished: Callable[[int, list[dict]], None] | None = None) -> list[list[dict]]:
    """Every (job, seed) of `work`, on Ray workers (`workers`: how many, or auto); per job, its results
    in seed order. Each result says whether it was `reused` from the run cache. `finished(i, results)` is
    called as soon as every seed of job i is done, reused or trained. The plan and the progress go to
    stdout (`Progress`)."""
    _check(work)
    jobs = [job for job, _ in work]
    runs = [(i, group) for i, (job, seeds) in enumerate(work) for group in groups(job, seeds)]
    costs = {run: cost(jobs[run[0]], run[1]) for run in runs}
    local = training.device_name(_local_device())
    done = {run: results for run in runs if (results := cached(jobs[run[0]], run[1], local)) is not None}
    todo = sorted((run for run in runs if run not in done), key=lambda run: costs[run], reverse=True)
    groups_left = Counter(i for i, _ in runs)

    def finish(run: tuple[int, Group], results: list[dict]) -> None:
        done[run] = results
        groups_left[run[0]] -= 1
        if finished and not groups_left[run[0]]:
            finished(run[0], _seed_order(done, run[0], work[run[0]][1]))

    progress = Progress()

    def kind(run: tuple[int, Group]) -> str:
        return jobs[run[0]].model_kind

    def begin(workers: int) -> None:
        """The plan, then the jobs that are all reused."""
        progress.plan(total=sum(len(seeds) for _, seeds in work), reused=sum(len(group) for _, group in done),
                      workers=workers, order=[(run, len(run[1]), costs[run], kind(run)) for run in todo],
                      timed=[(kind(run), costs[run], timed(results)) for run, results in done.items()])
        for run, results in list(done.items()):
            finish(run, results)

    if not todo:
        begin(workers=0)
    else:
        # Ray only where a grid runs: the benchmarks' single seeds (`run_seeds`) run on machines without it
        from xdbert.finetuning.control import engine

        # Grids running at once on this machine (experiments of a queue) share its cores: the slots beside
        # the run cache they share
        started = engine.connect(cores.slots_folder(jobs[0].run_cache) if jobs[0].run_cache else None)
        try:
            stack = max(len(group) for _, group in todo)  # a stack holds that many runs' weights and states
            n, gpu_each = engine.plan(len(todo), workers, stack * engine.run_gib([job.model_path for job in jobs]))
            todo = probing_order(todo, n, kind)  # a few small runs early, for the estimate of the time left
            begin(workers=n)
            shared = engine.share(jobs)
            actors = engine.start_workers(n, gpu_each)
            placed = engine.placement(actors)
            for warning in (engine.taking_turns(placed, gpu_each), engine.mkl_differs(placed)):
                if warning:
                    print(f"finetune: {warning}", flush=True)
            # A cluster's workers may compute on another device than this machine: look again under theirs.
            for device in {w["device"] for w in placed} - {local}:
                found = {run: results for run in todo if (results := cached(jobs[run[0]], run[1], device)) is not None}
                progress.skip(list(found), device)
                for run, results in found.items():
                    finish(run, results)
                todo = [run for run in todo if run not in found]
            progress.start_runs()
            for ended in engine.results(actors, shared, todo, tick_s=TICK_S):
                if ended is None:
                    progress.tick()
                    continue
                i, group, results = ended
                finish((i, group), keep(jobs[i], group, results))
                progress.done((i, group), timed(results))
        finally:
            if started:
                engine.disconnect()
    return [_seed_order(done, i, seeds) for i, (_, seeds) in enumerate(work)]


def _seed_order(done: dict[tuple[int, Group], list[dict]], i: int, seeds: list[int]) -> list[dict]:
    """Job i's results in the order of its seeds."""
    by_seed = {r["seed"]: r for (j, _), results in done.items() if j == i for r in results}
    return [by_seed[seed] for seed in seeds]
