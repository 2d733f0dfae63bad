"""The grid of runs (xdbert.finetuning.control.grid, engine): Ray workers and their plan, a killed worker, the run
cache and its keys."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from keyword_tasks import keyword_tables, settings
from xdbert import numerics, training
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import keys
from xdbert.finetuning.compute.loop import train_seed
from xdbert.finetuning.compute.stacked import train_group
from xdbert.finetuning.control import cores, engine, grid, progress, sizes
from xdbert.finetuning.control.prepare import prepare

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_the_grid_gives_the_same_bytes_with_one_or_two_ray_workers(bert_dir, local_ray):
    """Each run's result is a function of the run alone: not of how many workers the grid had, nor of
    whether a Ray worker or this process trained it."""
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 32), settings(spec, epochs=1))
    here = grid.run_seeds(job, [5, 6])
    one, two = (grid.run_grid([(job, [5, 6])], workers=n)[0] for n in (1, 2))
    assert [r["seed"] for r in two] == [5, 6]
    for a, b, c in zip(here, one, two):
        for other in (b, c):
            assert a["predictions"]["dev"].tobytes() == other["predictions"]["dev"].tobytes()
            assert (a["metrics"], a["first_epoch_loss"], a["last_epoch_loss"]) == \
                (other["metrics"], other["first_epoch_loss"], other["last_epoch_loss"])


@pytest.mark.slow
def test_the_grid_logs_no_ray_error(bert_dir, local_ray, capfd):
    """Tokenized jobs are above the size Ray passes inline. Given to the workers' constructors, they made
    Ray log an error in every grid (it cannot restart an actor from such arguments, ray-project/ray#53727);
    the workers now fetch them with their first run."""
    import pickle

    job = prepare("encoder", bert_dir, keyword_tables("sst2", 2000, 16), settings(get_task("sst2"), epochs=1))
    assert len(pickle.dumps([job])) > 100 * 1024  # Ray's limit for passing an argument inline
    (results,) = grid.run_grid([(job, [0])], workers=1)
    assert [r["seed"] for r in results] == [0]
    err = capfd.readouterr().err
    assert "object store" not in err and "core_worker" not in err, err[-2000:]


def test_workers_share_each_gpu_as_its_memory_allows(monkeypatch):
    """No GPU here: how many workers the grid starts on clusters of two 80 GiB GPUs, or 2 CPUs."""
    from types import SimpleNamespace

    resources = {"CPU": 32, "GPU": 2}
    monkeypatch.setattr(engine.ray, "cluster_resources", lambda: resources)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.delenv(engine.RUNS_PER_GPU_ENV, raising=False)
    assert engine.plan(100, "auto") == (16, 1 / 8)   # 8 runs of 2.5 GiB share each GPU
    assert engine.plan(3, "auto") == (3, 1 / 8)      # never more workers than runs
    assert engine.plan(100, 5) == (5, 1 / 8)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=16 * 2**30))
    assert engine.plan(100, "auto") == (12, 1 / 6)   # 16 GiB / 2.5 GiB
    assert engine.plan(100, "auto", 7.6) == (4, 1 / 2)  # a grid with ELECTRA-large's runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # GPUs on other machines of the cluster
    assert engine.plan(100, "auto") == (8, 1 / 4) and engine.plan(100, "auto", 7.6) == (2, 1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(engine.RUNS_PER_GPU_ENV, "1")
    assert engine.plan(100, "auto") == (2, 1.0)
    monkeypatch.delenv(engine.RUNS_PER_GPU_ENV)
    resources.update(CPU=4, GPU=1)  # a GPU machine of few cores: a worker per core, or the rest would never start
    assert engine.plan(100, "auto") == (4, 1 / 6) and engine.plan(100, 5) == (4, 1 / 6)
    resources.update(CPU=32, GPU=2)
    monkeypatch.setenv(engine.RUNS_PER_GPU_ENV, "many")
    with pytest.raises(PipelineError, match="XDBERT_RUNS_PER_GPU='many' must be a positive number, or auto"):
        engine.plan(100, "auto")
    resources.update(CPU=2, GPU=0)
    assert engine.plan(100, "auto") == (2, 0.0) and engine.plan(100, 8) == (2, 0.0)  # one worker per CPU


def test_cpu_workers_on_another_mkl_path_are_named_in_the_log():
    """A worker whose install built no xdbert/mkl_dispatch.c runs MKL's own kernels: on an Intel CPU its
    runs write other bytes than this process's would (xdbert.numerics)."""
    same = {"node": "a", "gpus": [], "mkl": numerics.mkl_path()}
    other = {**same, "mkl": "vendor" if same["mkl"] == "zen" else "zen"}
    assert engine.mkl_differs([same, same]) is None
    assert "1 CPU worker(s) take MKL's" in engine.mkl_differs([same, other])
    assert engine.mkl_differs([{**other, "gpus": ["0"]}]) is None  # a GPU run's GEMMs are not MKL's


def test_runs_sharing_a_gpu_without_mps_are_named_in_the_log(tmp_path, monkeypatch):
    """Runs sharing GPUs on a node with no MPS daemon take turns: the log says how many share and on how many
    nodes; nothing is said where MPS runs (its control pipe exists) or where each run has its GPU."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not engine.mps_running()
    (tmp_path / "control").touch()
    assert engine.mps_running()
    alone = [{"node": node, "gpus": ["0"], "mps": False} for node in ("a", "a", "b", "b")]
    line = engine.taking_turns(alone, 0.25)
    assert "4 runs share each GPU, and 2 node(s) run no MPS daemon" in line and "nvidia-cuda-mps-control -d" in line
    assert engine.taking_turns(alone, 1.0) is None
    assert engine.taking_turns([{**w, "mps": True} for w in alone], 0.25) is None
    assert engine.taking_turns([{"node": "a", "gpus": [], "mps": False}], 0.0) is None  # a CPU cluster


def test_a_runs_gpu_memory_grows_with_the_largest_model_of_the_grid(tmp_path):
    """Parameters are counted from the saved fp32 weights (4 bytes each): BERT-base's 110M take the measured
    base run's 2.5 GiB, ELECTRA-large's 335M three times as much; a small model never less."""
    def saved(name: str, parameters: int) -> str:
        folder = tmp_path / name
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as f:
            f.truncate(4 * parameters)  # sparse: the size is what counts
        return str(folder)

    base, large, tiny = saved("base", 110_000_000), saved("large", 335_000_000), saved("tiny", 2_000_000)
    assert engine.run_gib([base]) == pytest.approx(2.5)
    assert engine.run_gib([tiny]) == pytest.approx(2.5)
    assert engine.run_gib([base, large, tiny]) == pytest.approx(2.5 * 335 / 110)
    assert engine.run_gib([]) == pytest.approx(2.5)


def test_a_runs_cost_leaves_out_its_token_embedding_tables(tmp_path):
    """A run reads a few rows of a token-embedding table per token: the table counts for memory, not for the
    compute the grid's order and progress weigh. A full model holds both towers' tables under prefixes."""
    from safetensors.numpy import save_file

    (tmp_path / "full").mkdir()
    save_file({"clip.token_embedding.weight": np.zeros((100, 4), np.float32),
               "encoder.embeddings.word_embeddings.weight": np.zeros((50, 4), np.float32),
               "encoder.embeddings.position_embeddings.weight": np.zeros((8, 4), np.float32),
               "cross.0.weight": np.zeros((4, 3), np.float32)}, str(tmp_path / "full" / "model.safetensors"))
    assert sizes.compute_parameters(tmp_path / "full") == 8 * 4 + 4 * 3
    assert sizes.model_parameters(tmp_path / "full") >= (100 + 50 + 8) * 4 + 12


@pytest.mark.slow
def test_grid_pool_returns_each_jobs_results_in_seed_order(bert_dir, local_ray):
    # Runs of several jobs share one pool and finish in any order; each job must get its own seeds back.
    sst2 = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 32), settings(get_task("sst2"), epochs=1))
    stsb = prepare("encoder", bert_dir, keyword_tables("stsb", 48, 32), settings(get_task("stsb"), epochs=1))
    work = [(sst2, [3, 1]), (stsb, [2]), (sst2, [4])]
    pooled = grid.run_grid(work, workers=2)
    assert [[r["seed"] for r in rs] for rs in pooled] == [[3, 1], [2], [4]]
    for (job, seeds), results in zip(work, pooled):
        for seed, r in zip(seeds, results):
            alone = train_seed(job, seed)
            assert set(r["metrics"]["dev"]) == set(alone["metrics"]["dev"])  # stsb: pearson, spearman; sst2: accuracy
            np.testing.assert_array_equal(r["predictions"]["dev"], alone["predictions"]["dev"])
    with pytest.raises(PipelineError, match="no seeds"):
        grid.run_grid([(sst2, [0]), (stsb, [])], workers=2)


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_its_run_retried(bert_dir, local_ray):
    """A worker process killed mid-run (an OOM killer, a lost node): Ray starts another, the run is
    trained again, and the grid ends with the results it would have had."""
    import signal
    import threading
    import time

    import psutil

    job = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 32), settings(get_task("sst2"), epochs=3))
    expected = grid.run_seeds(job, [0, 1, 2, 3])
    killed, done = [], threading.Event()

    def kill_a_training_worker() -> None:
        while not done.is_set() and not killed:
            for proc in psutil.Process().children(recursive=True):
                try:
                    if proc.cmdline()[:1] == ["ray::Worker.train"]:
                        os.kill(proc.pid, signal.SIGKILL)
                        killed.append(proc.pid)
                        break
                except (psutil.Error, IndexError):
                    continue
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_training_worker)
    killer.start()
    try:
        (results,) = grid.run_grid([(job, [0, 1, 2, 3])], workers=2)
    finally:
        done.set()
        killer.join()
    assert killed, "no worker was seen training"
    assert [r["seed"] for r in results] == [0, 1, 2, 3]
    for a, b in zip(expected, results):
        assert a["predictions"]["dev"].tobytes() == b["predictions"]["dev"].tobytes() and a["metrics"] == b["metrics"]


@pytest.mark.slow
def test_a_two_node_cluster_puts_each_worker_on_its_own_gpu(bert_dir, monkeypatch):
    """Two Ray nodes with one (pretend) GPU each, as `ray start` on two GPU machines would make: one run
    per GPU gives two workers, each on its own node and GPU, and the grid's results are the usual ones.
    Without RAY_ADDRESS the stage starts Ray of its own even while that cluster runs. Each worker takes
    this process's MKL path: unpickling the actor class imports torch before xdbert, and without the
    setup hook that imports xdbert first, MKL picked Intel's GEMM kernels there on an Intel CPU. The
    model path is relative, as the stage's are: the workers start where the cluster was started, and
    find it from the stage's folder."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()  # the local instance other tests' grids share (`local_ray`): the next of them starts it again
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what each node's raylet sees; this machine has no GPU
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    cluster.add_node(num_cpus=1, num_gpus=1)
    monkeypatch.chdir(Path(bert_dir).parent)
    job = prepare("encoder", Path(bert_dir).name, keyword_tables("sst2", 48, 16), settings(get_task("sst2"), epochs=1))
    monkeypatch.setenv(engine.RUNS_PER_GPU_ENV, "1")
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)
    try:
        assert engine.connect()  # RAY_ADDRESS: join the cluster, start nothing of our own
        assert engine.plan(10, "auto") == (2, 1.0)
        where = ray.get([w.where.remote() for w in engine.start_workers(2, 1.0)])
        assert len({w["node"] for w in where}) == 2 and all(len(w["gpus"]) == 1 for w in where)
        assert [w["mkl"] for w in where] == [numerics.mkl_path()] * 2 == [("zen" if numerics.X86_64 else "vendor")] * 2
        (results,) = grid.run_grid([(job, [0, 1])])
        ray.shutdown()
        # No RAY_ADDRESS: a Ray instance of the stage's own, not the cluster this machine already runs
        monkeypatch.delenv("RAY_ADDRESS")
        assert engine.connect()
        assert ray.cluster_resources().get("GPU", 0) == 0 and len(ray.nodes()) == 1
    finally:
        ray.shutdown()
        cluster.shutdown()
    for a, b in zip(grid.run_seeds(job, [0, 1]), results):
        assert a["predictions"]["dev"].tobytes() == b["predictions"]["dev"].tobytes()


def test_a_ray_address_is_checked_for_ipv4_and_ipv6_heads(monkeypatch):
    """A head that answers passes, written as HOST:PORT, ray://HOST:PORT or, for IPv6, [HOST]:PORT."""
    import socket

    for family, host, written in ((socket.AF_INET, "127.0.0.1", "127.0.0.1"), (socket.AF_INET6, "::1", "[::1]")):
        with socket.socket(family) as head:
            head.bind((host, 0))
            head.listen()
            port = head.getsockname()[1]
            for address in (f"{written}:{port}", f"ray://{written}:{port}"):
                monkeypatch.setenv("RAY_ADDRESS", address)
                engine.check_address()
        monkeypatch.setenv("RAY_ADDRESS", f"{written}:{port}")  # the head has stopped
        with pytest.raises(PipelineError) as refused:
            engine.check_address()
        assert f"nothing answers at {written}:{port}" in str(refused.value)


def test_saved_runs_are_keyed_by_the_code_a_run_computes_with_and_no_other():
    """A saved run is stale when the code it ran changes (its modules, followed through imports, and the MKL
    library's source), not when the grid's control, a report, an analysis or the adaptation changes."""
    root = keys.imports.ROOT
    files = {str(p.relative_to(root)) for p in keys.code_files()}
    assert {"xdbert/finetuning/compute/loop.py", "xdbert/finetuning/compute/stacked.py", "xdbert/finetuning/compute/heads.py",
            "xdbert/model/modeling.py", "xdbert/data/tasks/metrics.py", "xdbert/numerics.py", "xdbert/mkl_dispatch.c"} <= files
    assert not files & {"xdbert/reports/tables.py", "xdbert/analysis/grounding.py", "xdbert/adaptation/loop.py",
                        "xdbert/cli.py", "xdbert/params.py", "xdbert/paths.py"}, files
    assert not [f for f in files if f.startswith("xdbert/finetuning/control/")], files  # the grid, its log, its settings
    assert len(keys.code_digest()) == 16


def test_a_run_is_keyed_by_the_settings_its_kind_reads(bert_dir):
    """Changing the dropout before a new head (or the CLIP blocks) keeps the encoder's saved runs, which
    read neither, and makes the CLIP tower's and the full model's stale; the learning rate counts for all."""
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    h = job.hyperparameters
    for kind in ("encoder", "clip", "full"):
        base = keys.run_key(dataclasses.replace(job, model_kind=kind), 0, "cpu")
        for change, read in (({"dropout": h.dropout / 2}, kind != "encoder"),
                             ({"clip_blocks_per_sentence": h.clip_blocks_per_sentence + 1}, kind != "encoder"),
                             ({"lr": h.lr * 2}, True)):
            other = dataclasses.replace(job, model_kind=kind, hyperparameters=dataclasses.replace(h, **change))
            assert (keys.run_key(other, 0, "cpu") != base) == read, (kind, change)


def test_a_killed_grid_resumes_with_the_seeds_it_had_not_finished(bert_dir, tmp_path, monkeypatch):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 32), settings(spec, epochs=1))
    uninterrupted = grid.run_seeds(job, [0, 1, 2])  # no run_cache: nothing is saved
    job.run_cache = str(tmp_path / "finished")
    trained, kill = [], [True]

    def killed_train_group(job, group, device="cpu"):
        trained.extend(group)
        if 2 in group and kill[0]:
            raise KeyboardInterrupt  # the machine goes away during seed 2
        return train_group(job, group, device)

    monkeypatch.setattr(grid, "train_group", killed_train_group)
    with pytest.raises(KeyboardInterrupt):
        grid.run_seeds(job, [0, 1, 2])
    assert sorted(p.name for p in (tmp_path / "finished").iterdir()) == sorted(
        f"{keys.run_key(job, seed, 'cpu')}.pt" for seed in (0, 1))
    kill[0] = False
    resumed = grid.run_seeds(job, [0, 1, 2])
    assert trained == [0, 1, 2, 2]  # only the seed in flight is trained again
    assert [r["reused"] for r in resumed] == [True, True, False]
    for a, b in zip(uninterrupted, resumed):
        np.testing.assert_array_equal(a["predictions"]["dev"], b["predictions"]["dev"])
        assert a["metrics"] == b["metrics"] and a["last_epoch_loss"] == b["last_epoch_loss"]
    # Other settings, another model or other data: the saved seeds do not count.
    job.hyperparameters = dataclasses.replace(job.hyperparameters, lr=1e-3)
    grid.run_seeds(job, [0])
    assert trained[4:] == [0]
    changed = tmp_path / "changed"
    shutil.copytree(bert_dir, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + "\n")
    assert prepare("encoder", changed, keyword_tables("sst2", 64, 32), settings(spec, epochs=1)).identity != job.identity
    assert prepare("encoder", bert_dir, keyword_tables("sst2", 64, 31), settings(spec, epochs=1)).identity != job.identity


def made_up_results(group: tuple, seconds: float = 2.0) -> list[dict]:
    """What a worker returns for a group of seeds, without training (for the grid's bookkeeping)."""
    device = training.device_name("cpu")
    return [{"seed": seed, "device": device, "metrics": {"dev": {"accuracy": 0.5}}, "seconds": seconds} for seed in group]


SECONDS_PER_COST = 1e-7  # the made-up time of a run: in proportion to its cost, with no fixed part


def without_ray(monkeypatch, trained: list) -> None:
    """The grid's engine without Ray: two workers, each run ends at once with made-up results, which say it
    took SECONDS_PER_COST per unit of its cost; a minute without a result comes first (`results` yields None)."""
    monkeypatch.setattr(engine, "connect", lambda slots=None: False)
    monkeypatch.setattr(engine, "plan", lambda n, workers, gib: (2, 0.0))
    monkeypatch.setattr(engine, "share", lambda jobs: jobs)
    monkeypatch.setattr(engine, "start_workers", lambda n, gpu_each: [])
    monkeypatch.setattr(engine, "placement", lambda workers: [{"device": training.device_name("cpu"), "gpus": [],
                                                                "mps": False, "mkl": numerics.mkl_path(), "node": "n"}])

    def results(workers, jobs, runs, tick_s=None):
        yield None
        for i, group in runs:
            trained.append((i, group))
            yield i, group, made_up_results(group, SECONDS_PER_COST * grid.cost(jobs[i], group))

    monkeypatch.setattr(engine, "results", results)


@pytest.mark.slow
def test_the_grid_prints_its_plan_first_then_progress_by_cost(bert_dir, tmp_path, monkeypatch, capsys):
    """The plan comes first (runs, reused, to train, workers, an estimate from the reused runs' times);
    each job's `finished` comes as soon as its last seed is done, a reused job's before any training;
    the runs go longest first, and the last line says the grid is done (xdbert.finetuning.control.progress
    and tests/test_finetuning_progress.py for the lines between)."""
    sst2 = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 16), settings(get_task("sst2"), epochs=1),
                   run_cache=tmp_path / "runs")
    long_sst2 = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 16), settings(get_task("sst2"), epochs=3),
                        run_cache=tmp_path / "runs")
    stsb = prepare("encoder", bert_dir, keyword_tables("stsb", 32, 12), settings(get_task("stsb"), epochs=1),
                   run_cache=tmp_path / "runs")
    grid.keep(stsb, (0,), made_up_results((0,), SECONDS_PER_COST * grid.cost(stsb, (0,))))  # trained before: reused
    trained = []
    without_ray(monkeypatch, trained)
    work = [(sst2, [0, 1]), (long_sst2, [0]), (stsb, [0])]

    def finished(i, results):
        print(f"finished {i}: seeds {[r['seed'] for r in results]}, reused {[r['reused'] for r in results]}")

    out = grid.run_grid(work, workers=2, finished=finished)
    lines = capsys.readouterr().out.splitlines()
    assert [[r["seed"] for r in results] for results in out] == [[0, 1], [0], [0]]
    assert trained == [(1, (0,)), (0, (0,)), (0, (1,))]  # 3 epochs first
    cost = grid.cost(sst2, (0,))
    assert grid.cost(long_sst2, (0,)) == 3 * cost and grid.cost(stsb, (0,)) < cost  # stsb: fewer, shorter examples
    # the reused run's seconds per cost: the 3-epoch run on one worker is the longest, the two others on the other
    est = progress.duration(SECONDS_PER_COST * 3 * cost)
    assert lines[0] == f"finetune: plan: 4 runs, 1 reused, 3 to train on 2 workers (est. {est})"
    assert lines[1:4] == ["finished 2: seeds [0], reused [True]", "finished 1: seeds [0], reused [False]",
                          "finished 0: seeds [0, 1], reused [False, False]"]
    assert len(lines) == 5 and progress.LINE.match(lines[4]) and lines[4].startswith("finetune: 100% of est. time, 3/3 runs, ")
    assert lines[4].endswith(" elapsed, done")
    capsys.readouterr()
    grid.run_grid(work, workers=2)  # all saved now: no Ray, no training
    assert capsys.readouterr().out.splitlines() == ["finetune: plan: 4 runs, 4 reused, 0 to train"]


WRITER = """
import sys, time
from pathlib import Path
import torch
from xdbert import training
folder, me, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.01)
for round in range(4):
    for k in range(8):  # the same runs, as two experiments that both train them write them
        training.save_checkpoint(folder / f"same{k}.pt", {"result": {"x": torch.arange(300_000) + k}}, f"same{k}", shared=True)
    for k in range(4):  # runs of their own
        training.save_checkpoint(folder / f"{me}{k}.pt", {"result": {"x": torch.arange(300_000) - k}}, f"{me}{k}", shared=True)
"""


def test_two_processes_writing_the_run_cache_at_once_leave_every_entry_whole(tmp_path):
    import subprocess

    folder, go = tmp_path / "runs", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), me, str(go)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for me in ("a", "b")]
    assert [w.stdout.readline().strip() for w in writers] == ["ready", "ready"]
    go.touch()  # both write at once
    for w in writers:
        assert w.wait(timeout=300) == 0, w.stderr.read()
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([f"same{k}.pt" for k in range(8)] + [f"{me}{k}.pt" for me in "ab" for k in range(4)])
    for name in names:
        state = training.load_checkpoint(folder / name, name.removesuffix(".pt"))  # its digest matches
        assert state is not None and state["result"]["x"].numel() == 300_000


def test_grids_at_once_share_the_machines_cores(tmp_path, monkeypatch):
    """A grid's local Ray instance takes the cores no other grid holds, at least one; a grid that ends, or
    whose process dies, frees them."""
    import subprocess

    slots = cores.slots_folder(tmp_path / "runs")
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from xdbert.finetuning.control "
                              "import cores; held = cores.claim(Path(sys.argv[1]), 3); print(len(held), flush=True); "
                              "time.sleep(600)", str(slots)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "3"  # another experiment's grid holds 3 of the 4 cores
        started = {}
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.setattr(engine, "machine_cores", lambda: 4)
        monkeypatch.setattr(engine.ray, "is_initialized", lambda: False)
        monkeypatch.setattr(engine.ray, "init", lambda **options: started.update(options))
        monkeypatch.setattr(engine.ray, "shutdown", lambda: None)
        assert engine.connect(slots) and started["num_cpus"] == 1
        assert cores.claim(slots, 4) == []  # a third finds none free ...
        engine.disconnect()
        assert engine.connect(slots) and started["num_cpus"] == 1  # ... and runs on one, beside the others
        engine.disconnect()
    finally:
        other.kill()
        other.wait()
    assert engine.connect(slots) and started["num_cpus"] == 4  # a dead grid's cores are free
    engine.disconnect()
    assert engine.connect() and started["num_cpus"] == 4  # without a run cache: every core
    engine.disconnect()
