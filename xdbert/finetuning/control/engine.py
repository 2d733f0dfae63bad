"""The grid's engine: Ray Core, the same code on a laptop, a GPU machine and a cluster.

`ray.init()` starts a local Ray instance when no cluster is named, and joins the cluster `RAY_ADDRESS`
names (Ray's own variable) when it is set. A local instance takes the cores no other grid on the machine
holds (xdbert.finetuning.control.cores), so experiments run at once share them. Each worker is an actor, a long-lived process: imports, the
CUDA context and compiled graphs are paid once per worker, not once per run. A worker fetches the
tokenized jobs once, trains one run at a time and returns its result; only the stage's process writes.

Ray places the workers: a worker asks for one CPU, and on GPUs for 1/`XDBERT_RUNS_PER_GPU` of one, so
Ray packs that many on each GPU and pins each to its GPU (inside a worker the device is `cuda`, never
`cuda:i`). A worker that dies is started again and its run retried, at most `RETRIES` times.

How many workers ran, and where, is the machine's business: it is no param, appears in no output, and
a run's result does not depend on it (each CPU run computes with a fixed number of threads).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterator

import ray
import torch
from ray.util import ActorPool

from xdbert import training
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.stacked import train_group
from xdbert.finetuning.control.cores import claim, machine_cores, release
from xdbert.finetuning.control.sizes import model_parameters
from xdbert.numerics import FINETUNING_THREADS, mkl_path

# How many runs go at once: environment variables, never params.
WORKERS_ENV = "XDBERT_FINETUNE_WORKERS"
# Runs sharing one GPU. A base-model run at GLUE lengths leaves an H100 or H200 mostly idle: on an H200,
# 4 compiled runs sharing it gave 3.26x the tokens/s of one, 8 gave 3.64x, each needing under 2 GiB
# (bench/results/h200). `auto` takes as many as the GPU's memory holds runs of the grid's largest model
# (`run_gib`), at most 8. Without CUDA's multi-process service (MPS) the runs' kernels take turns on the
# GPU; under it they run side by side: 4 recorded runs made 233,705 real tokens/s under MPS (an H200,
# 2026-11-28), 186,791 without (another H200, 2026-11-27).
RUNS_PER_GPU_ENV = "XDBERT_RUNS_PER_GPU"
MAX_RUNS_PER_GPU = 8
GIB_PER_RUN = 2.5  # the measured 1.9 GiB of a BERT-base run, with room for longer batches
# BERT-base's parameters, which GIB_PER_RUN holds: the measured run had 86M (a 4,000-word vocabulary), and
# bert-base-uncased's 24M more embedding parameters add 0.4 GiB at 16 bytes each
BASE_PARAMETERS = 110_000_000
# `auto` on a cluster whose GPUs this machine cannot see: 4 runs of GIB_PER_RUN fit a 16 GiB V100 or T4
REMOTE_RUNS_PER_GPU = 4
RETRIES = 3  # a worker that dies is restarted, and its run retried, this many times


def _count_from_env(name: str, auto: str) -> int | str:
    value = os.environ.get(name, "auto").strip()
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise PipelineError(f"{name}={value!r} must be a positive number, or auto ({auto})")
    return int(value)


def workers_from_env() -> int | str:
    """`XDBERT_FINETUNE_WORKERS`: a positive number, or `auto` (the default): every GPU's share of runs,
    or one worker per CPU of the Ray cluster."""
    return _count_from_env(WORKERS_ENV, "every GPU's runs, or one worker per CPU")


def run_gib(model_paths: list) -> float:
    """GPU memory a run of the largest of these saved models needs: GIB_PER_RUN for BERT-base, in
    proportion to the parameters for larger models (AdamW's fp32 weights, gradients and two moments, 16
    bytes a parameter, are most of it), so that ELECTRA-large's runs (about 7.6 GiB) do not share a GPU
    as base runs do."""
    parameters = max((model_parameters(p) for p in model_paths), default=0)
    return max(GIB_PER_RUN, GIB_PER_RUN * parameters / BASE_PARAMETERS)


def runs_per_gpu_from_env() -> int | str:
    """`XDBERT_RUNS_PER_GPU`: a positive number, or `auto` (the default)."""
    return _count_from_env(RUNS_PER_GPU_ENV, f"up to {MAX_RUNS_PER_GPU}, as the GPU's memory allows")


def runs_per_gpu(gib_per_run: float = GIB_PER_RUN) -> int:
    """`XDBERT_RUNS_PER_GPU`, or for `auto` as many runs of `gib_per_run` as this machine's first GPU
    holds, at most 8 (a cluster's GPUs that this machine cannot see: 4 base runs, fewer larger ones)."""
    chosen = runs_per_gpu_from_env()
    if chosen != "auto":
        return chosen
    if not torch.cuda.is_available():
        return max(1, int(REMOTE_RUNS_PER_GPU * GIB_PER_RUN // gib_per_run))
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return max(1, min(MAX_RUNS_PER_GPU, int(gib // gib_per_run)))


def mps_running() -> bool:
    """Whether CUDA's multi-process service runs on this node: its control daemon's pipe exists, in
    `CUDA_MPS_PIPE_DIRECTORY` or the daemon's default folder."""
    return (Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control").exists()


def taking_turns(placed: list[dict], gpu_each: float) -> str | None:
    """For the log: runs share GPUs (`gpu_each` < 1) on nodes without MPS (`placed`: the workers'
    `where`), so their kernels take turns; None when nothing shares a GPU or MPS runs wherever it does."""
    nodes = {w["node"] for w in placed if w["gpus"] and not w["mps"]}
    if gpu_each >= 1 or not nodes:
        return None
    return (f"{round(1 / gpu_each)} runs share each GPU, and {len(nodes)} node(s) run no MPS daemon, so their kernels "
            "take turns: start it there (`nvidia-cuda-mps-control -d`) before Ray for about 1.25x (docs/gpus.md)")


def mkl_differs(placed: list[dict]) -> str | None:
    """For the log: CPU workers (`placed`: their `where`) that take another MKL path than this process, so
    that on an Intel CPU their runs write other bytes than this process would; None when all agree."""
    others = [w for w in placed if not w["gpus"] and w["mkl"] != mkl_path()]
    if not others:
        return None
    return (f"{len(others)} CPU worker(s) take MKL's {others[0]['mkl']} GEMM path, this process the {mkl_path()} one: "
            "on Intel CPUs their runs write other bytes; install xdbert there with a C compiler (docs/reproducibility.md)")


# How long the head of `RAY_ADDRESS` has to answer. ray.init itself retries an address where nothing
# answers for ever, logging only that the GCS timed out.
ANSWER_TIMEOUT_S = 20


def check_address() -> None:
    """A `RAY_ADDRESS` that is set names a head that answers, checked before the stage does any work."""
    address = os.environ.get("RAY_ADDRESS", "")
    if address in ("", "auto", "local"):  # ray.init's own words: it fails at once when "auto" finds no cluster
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise PipelineError(f"RAY_ADDRESS={address!r} is not a Ray address; allowed: HOST:PORT (a cluster's head, "
                            "port 6379 by default), ray://HOST:PORT (Ray Client), auto, or unset for a local instance")
    ip = host.removeprefix("[").removesuffix("]")  # an IPv6 head is written [::1]:6379; sockets take ::1
    try:
        socket.create_connection((ip, int(port)), timeout=ANSWER_TIMEOUT_S).close()
    except OSError as e:
        raise PipelineError(f"RAY_ADDRESS={address!r}: nothing answers at {host}:{port} ({e}); start the cluster's "
                            "head there (`ray start --head`) or unset RAY_ADDRESS to run on a local instance") from None


# The cores this process's local Ray instance holds (xdbert.finetuning.control.cores), until `disconnect`
_held: list = []


def connect(slots: Path | None = None) -> bool:
    """Join the Ray cluster of `RAY_ADDRESS`, or start a local instance sized to this machine: to the cores
    free in the `slots` folder that other grids share (`cores.claim`, at least one), or to every core
    without one. True when this call started Ray (so the caller shuts it down)."""
    if ray.is_initialized():
        return False
    check_address()
    # Every worker imports xdbert first: unpickling the actor class imports its module's globals, torch
    # before xdbert, and MKL would then pick its kernels by the CPU's vendor (xdbert.numerics)
    options = {"include_dashboard": False, "logging_level": "ERROR", "configure_logging": True,
               "runtime_env": {"worker_process_setup_hook": "xdbert.numerics.fix_cpu_numerics"}}
    if os.environ.get("RAY_ADDRESS"):
        try:
            ray.init(**options)  # ray.init reads RAY_ADDRESS itself
        except ConnectionError as e:  # "auto" with no cluster on this machine
            raise PipelineError(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}: {e}") from None
    else:
        cores = machine_cores()
        if slots is not None:
            _held.extend(claim(slots, cores))
            if len(_held) < cores:
                print(f"finetune: {cores - len(_held)} of this machine's {cores} cores are taken by other grids "
                      f"({slots}); this one runs on {max(1, len(_held))}", flush=True)
            cores = max(1, len(_held))
        # "local": a new instance, always. With no address ray.init would join the last cluster `ray start`
        # made on this machine, which may be another user's, or a test's that is about to stop.
        ray.init(address="local", num_cpus=cores, num_gpus=torch.cuda.device_count(), **options)
    return True


def disconnect() -> None:
    ray.shutdown()
    release(_held)


def plan(n_runs: int, workers: int | str, gib_per_run: float = GIB_PER_RUN) -> tuple[int, float]:
    """(number of workers, GPUs each asks for: 0 on a CPU cluster), from the cluster's resources and the
    memory of the grid's largest run."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    if gpus:
        share = runs_per_gpu(gib_per_run)
        slots, gpu_each = min(gpus * share, cpus), 1.0 / share  # each worker also takes a CPU (`start_workers`)
    else:
        slots, gpu_each = cpus, 0.0
    n = slots if workers == "auto" else min(int(workers), slots)  # more would wait for resources forever
    return max(1, min(n, n_runs)), gpu_each


@ray.remote
class Worker:
    """One long-lived worker: its device, the jobs once its first run has fetched them, and `train` for
    one run at a time.

    The jobs come with each run, not to the constructor: Ray cannot restart an actor whose constructor
    arguments lived in its object store (ray-project/ray#53727, about which it logs an error), and the
    tokenized jobs are far above the size it stores inline."""

    def __init__(self, folder: str) -> None:
        # The jobs' model paths are relative to the stage's folder, and a worker starts in the folder its
        # node's `ray start` ran in: on a cluster, the repository's path on a shared filesystem. Where it is
        # missing, `train` names the node.
        if os.path.isdir(folder):
            os.chdir(folder)
        self.jobs: list | None = None
        gpu = torch.cuda.is_available() and bool(ray.get_gpu_ids())
        self.device = "cuda" if gpu else "cpu"  # Ray made the worker's GPU the only one it sees
        if not gpu:
            torch.set_num_threads(FINETUNING_THREADS)  # a run's bytes must not depend on the machine

    def where(self) -> dict:
        """Where this worker runs: its node, the GPUs Ray gave it, the device name in its results, whether
        MPS runs there, and MKL's path (`numerics.mkl_path`)."""
        return {"node": ray.get_runtime_context().get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
                "device": training.device_name(self.device), "pid": os.getpid(),
                "mps": self.device == "cuda" and mps_running(), "mkl": mkl_path()}

    def train(self, jobs: list[ray.ObjectRef], index: int, group: tuple[int, ...]) -> tuple[int, tuple, list[dict]]:
        """Run the seeds `group` of job `index` (`stacked.train_group`). `jobs`: [`share`'s reference], in a
        list so that Ray passes the reference as it is, and the jobs are fetched once, and again only by a
        restarted worker."""
        if self.jobs is None:
            self.jobs = ray.get(jobs[0])
        job = self.jobs[index]
        if not os.path.exists(job.model_path):
            raise PipelineError(f"{job.model_path} is not on the node {ray.get_runtime_context().get_node_id()}: "
                                "the workers of a cluster read the models from a filesystem every node sees")
        return index, group, train_group(job, group, self.device)


def share(jobs: list) -> ray.ObjectRef:
    """`jobs` in Ray's object store, once for every worker. Keep the reference while the workers live: a
    worker that is restarted fetches the jobs again from it."""
    return ray.put(jobs)


def start_workers(n: int, gpu_each: float) -> list:
    """`n` workers, each asking for one CPU and `gpu_each` of a GPU, in this process's folder."""
    options = {"num_cpus": 1, "num_gpus": gpu_each, "max_restarts": RETRIES, "max_task_retries": RETRIES}
    return [Worker.options(**options).remote(os.getcwd()) for _ in range(n)]


def placement(workers: list) -> list[dict]:
    """Where each worker runs (`Worker.where`): its node, GPUs, device name and whether MPS runs there."""
    return ray.get([worker.where.remote() for worker in workers])


def results(workers: list, jobs: ray.ObjectRef, runs: list[tuple[int, tuple]],
            tick_s: float | None = None) -> Iterator[tuple[int, tuple, list[dict]] | None]:
    """(job index, seeds, their results) of every run (a group of seeds, `keys.groups`) of the `share`d
    `jobs` as it finishes; a free worker takes the next run in order. None after `tick_s` seconds without
    one, for the log."""
    pool = ActorPool(workers)
    for run in runs:
        pool.submit(lambda worker, r: worker.train.remote([jobs], *r), run)
    while pool.has_next():
        try:
            yield pool.get_next_unordered(timeout=tick_s)
        except TimeoutError:
            yield None
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, PipelineError):
                raise PipelineError(str(e.cause)) from None
            raise
        except ray.exceptions.RayActorError as e:
            raise PipelineError(f"a finetuning worker died {RETRIES + 1} times ({type(e).__name__}); the runs that "
                                "finished are kept: rerun the stage to train the rest") from e
