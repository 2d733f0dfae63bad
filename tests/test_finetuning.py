"""Finetuning: the three task kinds learn, seeds reproduce, batches and lr groups are right, the stage fails cleanly."""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from xdbert.data.tasks.registry import TaskSpec, get_task, to_table, write_tasks
from xdbert import numerics, paths, training
from xdbert.errors import PipelineError
from xdbert.finetuning import data as fd
from xdbert.finetuning import cores, engine, grid, loop, progress
from xdbert.finetuning import job as job_module
from xdbert.finetuning.heads import EncoderClassifier, RowSubsetEmbedding
from xdbert.finetuning.job import build_model, prepare
from xdbert.finetuning.loop import pad_multiple, train_seed
from xdbert.finetuning.rates import layer_depths, parameter_groups
from xdbert.finetuning.results import write_results
from xdbert.finetuning.runs import Study
from xdbert.finetuning.settings import FinetuneSettings, learning_rate, size_of
from xdbert.finetuning.stacked import train_group
from xdbert.clip import clip_block_mask
from xdbert.model.clip_tower import ClipLayout
from xdbert.model.settings import family
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
FILLER = "the a of to in on at with from river stone cloud table green small quiet early north paper".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# ---------------------------------------------------------------------------------------------------
# Tiny data where one keyword decides the label, and a tiny random BERT
# ---------------------------------------------------------------------------------------------------

def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(FILLER) for _ in range(n)]


def _sentence(rng: random.Random, keyword: str | None, lo: int = 2, hi: int = 9) -> str:
    words = _words(rng, rng.randint(lo, hi))
    if keyword:
        words.insert(rng.randint(0, len(words)), keyword)
    return " ".join(words)


def keyword_rows(task: str, n: int, seed: int) -> dict[str, list]:
    """sst2: `good`/`bad` decides; stsb: the number of `up` in the second sentence is the score;
    swag: the ending with `yes` is right; mnli: `yes`/`maybe`/`no` in the hypothesis."""
    rng = random.Random(f"{task}:{seed}")
    rows = {"idx": list(range(n)), "text_a": [], "text_b": [], "choices": [], "label": []}
    for i in range(n):
        if task == "sst2":
            y = i % 2
            rows["text_a"].append(_sentence(rng, "good" if y else "bad"))
            rows["text_b"].append(None), rows["choices"].append(None), rows["label"].append(y)
        elif task == "stsb":
            y = i % 4
            b = _words(rng, rng.randint(2, 6)) + ["up"] * y
            rng.shuffle(b)
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append(" ".join(b))
            rows["choices"].append(None), rows["label"].append(float(y))
        elif task == "mnli":
            y = i % 3
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append(_sentence(rng, ("yes", "maybe", "no")[y]))
            rows["choices"].append(None), rows["label"].append(y)
        elif task == "swag":
            y = i % 4
            rows["text_a"].append(_sentence(rng, None)), rows["text_b"].append("then")
            rows["choices"].append([_sentence(rng, "yes" if j == y else None, 1, 4) for j in range(4)])
            rows["label"].append(y)
    return rows


def keyword_tables(task: str, n_train: int = 160, n_dev: int = 64) -> dict:
    spec = get_task(task)
    return {split: to_table(spec, keyword_rows(task, n_train if split == "train" else n_dev, k))
            for k, split in enumerate(spec.splits)}


def save_tiny_bert(directory: Path, layers: int = 2, hidden: int = 32) -> Path:
    """A random BERT and a word-level WordPiece vocabulary over the test words, as save_pretrained writes them."""
    from transformers import BertConfig, BertModel, BertTokenizer

    words = SPECIALS + sorted(set(FILLER) | {"good", "bad", "up", "yes", "no", "maybe", "then"})
    # built like xdbert.data.tokenization.vocab.train_wordpiece builds the pipeline's tokenizer
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True, model_max_length=64)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(words), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=64)
    BertModel(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("bert") / "tiny")


def settings(spec: TaskSpec, lr: float = 3e-3, **changes) -> FinetuneSettings:
    """The embedded profile's `finetune` settings for `spec` at test sizes, with rate `lr` for every model size."""
    sizes = dict(epochs=6, batch_size=16, max_len=32, warmup_ratio=0.1, length_group=4)
    embedded = FinetuneSettings.from_params(values("embedded"), spec)
    return dataclasses.replace(embedded, lr={spec.name: {"base": lr, "large": lr}}, **{**sizes, **changes})


# ---------------------------------------------------------------------------------------------------
# Learning, per task kind
# ---------------------------------------------------------------------------------------------------

def test_classification_learns_and_seeds_reproduce(bert_dir):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2"), settings(spec))
    first, other = grid.run_seeds(job, [0, 1])
    again = train_seed(job, 0)
    assert first["metrics"]["dev"]["accuracy"] >= 0.9, first["metrics"]
    assert first["precision"] == "no"  # `auto` on the CPU
    assert first["last_epoch_loss"] < 0.5 * first["first_epoch_loss"]
    np.testing.assert_array_equal(first["predictions"]["dev"], again["predictions"]["dev"])
    assert first["first_epoch_loss"] == again["first_epoch_loss"] and first["last_epoch_loss"] == again["last_epoch_loss"]
    assert other["first_epoch_loss"] != first["first_epoch_loss"]  # another head init and batch order


def test_regression_learns_and_seeds_differ(bert_dir):
    spec = get_task("stsb")
    job = prepare("encoder", bert_dir, keyword_tables("stsb"), settings(spec, epochs=8, lr=5e-3))
    assert job.data["train"].labels.dtype == np.float32 and job.data["train"].choices == 1
    a, b = grid.run_seeds(job, [0, 1])
    assert a["metrics"]["dev"]["spearman"] > 0.7, a["metrics"]  # 0.89-0.97 over seeds 0-9 here
    assert a["last_epoch_loss"] < 0.5 * a["first_epoch_loss"]
    assert a["predictions"]["dev"].dtype == np.float64
    assert not np.array_equal(a["predictions"]["dev"], b["predictions"]["dev"])


def test_multiple_choice_learns(bert_dir):
    spec = get_task("swag")
    job = prepare("encoder", bert_dir, keyword_tables("swag"), settings(spec, epochs=8))
    assert job.data["train"].choices == 4
    (r,) = grid.run_seeds(job, [0])
    assert r["metrics"]["dev"]["accuracy"] >= 0.6, r["metrics"]  # chance is 0.25
    assert r["last_epoch_loss"] < 0.7 * r["first_epoch_loss"]
    assert set(np.unique(r["predictions"]["dev"])) <= {0, 1, 2, 3}


def test_fp16_forced_on_the_cpu_learns_with_loss_scaling(bert_dir, monkeypatch):
    """What a V100 or T4 runs (`auto` there is fp16): autocast to half precision and a grad scaler."""
    steps = []
    step = torch.amp.GradScaler.step
    monkeypatch.setattr(torch.amp.GradScaler, "step", lambda self, *a, **k: steps.append(self.is_enabled()) or step(self, *a, **k))
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2"), settings(spec, precision="fp16"))
    r = train_seed(job, 0)
    assert r["precision"] == "fp16" and steps and all(steps)
    assert r["metrics"]["dev"]["accuracy"] >= 0.8, r["metrics"]
    assert r["last_epoch_loss"] < 0.5 * r["first_epoch_loss"]


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


def test_nan_loss_stops_with_pipeline_error(bert_dir, monkeypatch):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 32, 16), settings(spec, epochs=1))
    real = build_model

    class Broken(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch):
            return self.inner(batch) * float("nan")

    monkeypatch.setattr(loop, "build_model", lambda job: Broken(real(job)))
    with pytest.raises(PipelineError, match="loss became nan at step 0"):
        train_seed(job, 0)


def test_saved_runs_are_keyed_by_the_code_the_grid_runs_and_no_other():
    """A saved run is stale when the code it ran changes (its modules, followed through imports, and the MKL
    library's source), not when a report, an analysis or the adaptation changes."""
    root = job_module.imports.ROOT
    files = {str(p.relative_to(root)) for p in job_module.code_files()}
    assert {"xdbert/finetuning/loop.py", "xdbert/finetuning/stacked.py", "xdbert/finetuning/heads.py",
            "xdbert/model/modeling.py", "xdbert/data/tasks/metrics.py", "xdbert/numerics.py", "xdbert/mkl_dispatch.c"} <= files
    assert not files & {"xdbert/reports/tables.py", "xdbert/analysis/grounding.py", "xdbert/adaptation/loop.py",
                        "xdbert/cli.py"}, files
    assert len(job_module.code_digest()) == 16


def test_a_run_is_keyed_by_the_settings_its_kind_reads(bert_dir):
    """Changing the dropout before a new head (or the CLIP blocks) keeps the encoder's saved runs, which
    read neither, and makes the CLIP tower's and the full model's stale; the learning rate counts for all."""
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    h = job.hyperparameters
    for kind in ("encoder", "clip", "full"):
        base = grid.run_key(dataclasses.replace(job, model_kind=kind), 0, "cpu")
        for change, read in (({"dropout": h.dropout / 2}, kind != "encoder"),
                             ({"clip_blocks_per_sentence": h.clip_blocks_per_sentence + 1}, kind != "encoder"),
                             ({"lr": h.lr * 2}, True)):
            other = dataclasses.replace(job, model_kind=kind, hyperparameters=dataclasses.replace(h, **change))
            assert (grid.run_key(other, 0, "cpu") != base) == read, (kind, change)


def test_a_model_folder_is_read_once_for_every_task(bert_dir, tmp_path, monkeypatch):
    """The stage prepares one job per (model, task): each model file is hashed once, and again only once
    it changes."""
    job_module.code_digest()  # the code's files are hashed once per process anyway
    reads, sha256_file = [], job_module.sha256_file
    monkeypatch.setattr(job_module, "sha256_file", lambda path: reads.append(path.name) or sha256_file(path))
    job_module._file_digest.cache_clear()
    model = tmp_path / "model"
    shutil.copytree(bert_dir, model)
    files = sorted(p.name for p in model.rglob("*") if p.is_file())
    first = [prepare("encoder", model, keyword_tables(task, 8, 4), settings(get_task(task))) for task in ("sst2", "stsb")]
    assert sorted(reads) == files and first[0].identity != first[1].identity
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    again = prepare("encoder", model, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    assert reads[len(files):] == ["config.json"] and again.identity != first[0].identity


def test_a_tokenizer_folder_without_its_vocabulary_is_refused(bert_dir, tmp_path):
    """transformers loads such a folder as a tokenizer of the special tokens alone, and every word would
    read as [UNK]: the run would train and score on nothing, and exit 0."""
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer

    model = tmp_path / "model"
    shutil.copytree(bert_dir, model)
    for name in ("tokenizer.json", "vocab.txt"):
        (model / name).unlink(missing_ok=True)
    with pytest.raises(PipelineError, match=f"{model} holds no vocabulary .* rerun the stage that writes it"):
        prepare("encoder", model, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    with pytest.raises(PipelineError, match="holds no vocabulary"):
        load_encoder_tokenizer(str(model))

def test_a_max_len_past_the_encoders_positions_is_refused_before_any_training(bert_dir):
    with pytest.raises(PipelineError, match="`finetune.max_len: 100` is longer than the 64 positions .* at most 64"):
        prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2"), max_len=100))
    assert prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2"), max_len=64)).identity

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
        f"{grid.run_key(job, seed, 'cpu')}.pt" for seed in (0, 1))
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


def without_ray(monkeypatch, trained: list) -> None:
    """The grid's engine without Ray: two workers, each run ends at once with made-up results; a minute
    without a result comes first (`results` yields None)."""
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
            yield i, group, made_up_results(group)

    monkeypatch.setattr(engine, "results", results)


def test_the_grid_prints_its_plan_first_then_progress_by_cost(bert_dir, tmp_path, monkeypatch, capsys):
    """The plan comes first (runs, reused, to train, workers, an estimate from the reused runs' times);
    each job's `finished` comes as soon as its last seed is done, a reused job's before any training;
    a line follows every run here (each is over 5% of the cost), the longest first."""
    sst2 = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 16), settings(get_task("sst2"), epochs=1),
                   run_cache=tmp_path / "runs")
    long_sst2 = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 16), settings(get_task("sst2"), epochs=3),
                        run_cache=tmp_path / "runs")
    stsb = prepare("encoder", bert_dir, keyword_tables("stsb", 32, 12), settings(get_task("stsb"), epochs=1),
                   run_cache=tmp_path / "runs")
    grid.keep(stsb, (0,), made_up_results((0,), seconds=60.0))  # trained before: reused
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
    # 60 s of one run of stsb's cost: the 5 sst2 epochs' worth on 2 workers
    est = progress.duration(60 / grid.cost(stsb, (0,)) * 5 * cost / 2)
    assert lines[0] == f"finetune: plan: 4 runs, 1 reused, 3 to train on 2 workers (est. {est})"
    assert lines[1] == "finished 2: seeds [0], reused [True]"
    assert lines[2] == "finished 1: seeds [0], reused [False]" and lines[3].startswith("finetune: 60% of est. cost, 1/3 runs, about")
    assert lines[4].startswith("finetune: 80% of est. cost, 2/3 runs, about")
    assert lines[5:] == ["finished 0: seeds [0, 1], reused [False, False]", "finetune: 100% of est. cost, 3/3 runs, about under 1 min left"]
    capsys.readouterr()
    grid.run_grid(work, workers=2)  # all saved now: no Ray, no training
    assert capsys.readouterr().out.splitlines() == ["finetune: plan: 4 runs, 4 reused, 0 to train"]


def test_progress_says_a_line_at_every_5_percent_of_the_cost_and_every_minute():
    now, said = [0.0], []
    p = progress.Progress(runs=10, cost=100.0, say=said.append, clock=lambda: now[0])
    p.plan(total=12, reused=2, workers=2)
    assert said == ["finetune: plan: 12 runs, 2 reused, 10 to train on 2 workers (an estimate once the first runs end)"]
    now[0] = 59
    p.tick()
    p.done(1, 4.0)  # under 5%, under a minute: silent
    assert len(said) == 1
    now[0] = 60
    p.tick()
    assert said[-1] == "finetune: 4% of est. cost, 1/10 runs, about 24 min left"  # 96 more at 4 a minute
    p.done(1, 1.0)  # 5%
    assert said[-1] == "finetune: 5% of est. cost, 2/10 runs, about 19 min left"
    now[0] = 300
    p.done(8, 95.0)
    assert said[-1] == "finetune: 100% of est. cost, 10/10 runs, about under 1 min left" and len(said) == 4
    before = progress.Progress(runs=1, cost=10.0, say=said.append, clock=lambda: 0.0)
    before.plan(total=1, reused=0, workers=1)
    before.tick()
    assert said[-1].endswith("0 to train") is False and "an estimate once the first runs end" in said[-1]
    assert [progress.duration(s) for s in (20, 90, 3600 + 5 * 60)] == ["under 1 min", "2 min", "1 h 5 min"]


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
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from xdbert.finetuning "
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


# ---------------------------------------------------------------------------------------------------
# Batching and padding
# ---------------------------------------------------------------------------------------------------

def test_length_grouped_batches_cover_every_example_once():
    lengths = np.random.default_rng(0).integers(3, 60, size=203)
    batches = fd.length_grouped_batches(lengths, batch_size=8, seed=1, epoch=0, group=5)
    flat = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(flat), np.arange(203))
    assert all(len(b) <= 8 for b in batches) and sum(len(b) < 8 for b in batches) <= -(-203 // 40)
    # grouping: within a batch the lengths are close (sorted mega-batches), unlike a random batch
    spread = np.mean([np.ptp(lengths[b]) for b in batches if len(b) == 8])
    random_spread = np.mean([np.ptp(lengths[b]) for b in np.array_split(np.random.default_rng(1).permutation(203), 25)])
    assert spread < 0.5 * random_spread
    again = fd.length_grouped_batches(lengths, batch_size=8, seed=1, epoch=0, group=5)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    other_epoch = np.concatenate(fd.length_grouped_batches(lengths, batch_size=8, seed=1, epoch=1, group=5))
    assert not np.array_equal(flat, other_epoch)


def test_dynamic_padding_pads_to_the_batch_max(bert_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bert_dir)
    spec = get_task("mnli")
    table = keyword_tables("mnli", 8, 4)["train"]
    data = fd.encode_bert(tok, spec, table, max_len=32)
    rows = np.array([5, 1, 2])
    batch = fd.collate(data, rows)
    lengths = data.lengths[rows]
    assert batch["input_ids"].shape == (3, lengths.max())
    np.testing.assert_array_equal(batch["attention_mask"].sum(1), lengths)
    for j, r in enumerate(rows):
        ref = tok(table["text_a"][int(r)].as_py(), table["text_b"][int(r)].as_py())
        n = len(ref["input_ids"])
        assert batch["input_ids"][j, :n].tolist() == ref["input_ids"]
        assert batch["token_type_ids"][j, :n].tolist() == ref["token_type_ids"]
        assert (batch["input_ids"][j, n:] == tok.pad_token_id).all()
    np.testing.assert_array_equal(batch["labels"], data.labels[rows])
    # multiple choice: (B, 4, L), L the longest of all 4 x B sequences
    swag = fd.encode_bert(tok, get_task("swag"), keyword_tables("swag", 6, 4)["train"], max_len=32)
    mc = fd.collate(swag, np.array([0, 3]))
    longest = swag.inputs["input_ids"].lengths.reshape(-1, 4)[[0, 3]].max()
    assert mc["input_ids"].shape == (2, 4, longest) and mc["attention_mask"].shape == (2, 4, longest)
    # truncation at max_len
    assert fd.encode_bert(tok, spec, table, max_len=6).lengths.max() == 6


# ---------------------------------------------------------------------------------------------------
# Layer-wise learning-rate decay


def test_rounding_lengths_up_to_8_changes_no_score(bert_dir):
    """The GPU rounds batch lengths up to 8 (`pad_multiple`): the extra positions are masked padding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bert_dir)
    spec = get_task("mnli")
    data = fd.encode_bert(tok, spec, keyword_tables("mnli", 8, 4)["train"], max_len=32)
    rows = np.array([5, 1, 2])
    exact, rounded = fd.collate(data, rows), fd.collate(data, rows, multiple=8)
    longest = int(data.lengths[rows].max())
    assert longest % 8 != 0 and rounded["input_ids"].shape == (3, -(-longest // 8) * 8)
    np.testing.assert_array_equal(rounded["attention_mask"].sum(1), data.lengths[rows])
    np.testing.assert_array_equal(rounded["input_ids"][:, :longest], exact["input_ids"])
    assert (rounded["input_ids"][:, longest:] == tok.pad_token_id).all()
    torch.manual_seed(0)
    model = EncoderClassifier(bert_dir, spec).eval()
    with torch.no_grad():
        scores = [model({k: torch.from_numpy(v) for k, v in b.items()}) for b in (exact, rounded)]
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)
    # rounding only on a GPU, and never past a max_len that is no multiple of 8
    assert pad_multiple(32, torch.device("cuda")) == 8
    assert pad_multiple(32, torch.device("cpu")) == 1
    assert pad_multiple(100, torch.device("cuda")) == 1


@pytest.mark.parametrize("kind, task", [("encoder", "sst2"), ("full", "swag"), ("clip", "stsb")])
def test_compiled_training_matches_eager(bert_dir, crossmodal_dirs, monkeypatch, kind, task):
    """`finetune.compile` traces the model once for every batch length and trains to the same result.
    The graph is run by dynamo's `eager` backend: the tracing, guards and dynamic shapes are real, only
    the code generation (a minute on this CPU, measured on the GPU in bench/results/h100) is left out.
    With `fullgraph=True` any graph break fails: no kind reads its data on the host in its forward."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    calls = []

    def compile_eagerly(model, **kw):
        calls.append(kw)
        return real_compile(model, backend="eager", fullgraph=True, **kw)

    spec = get_task(task)
    tables = keyword_tables(task, 48, 32)
    path = bert_dir if kind == "encoder" else crossmodal_dirs / kind
    eager = train_seed(prepare(kind, path, tables, settings(spec, epochs=2), tokenizer_dir=bert_dir), 0)
    monkeypatch.setattr(torch, "compile", compile_eagerly)
    torch._dynamo.reset()
    counters.clear()
    compiled = train_seed(prepare(kind, path, tables, settings(spec, epochs=2, compile=True), tokenizer_dir=bert_dir), 0)
    assert calls == [{"dynamic": True, "mode": None}]  # CUDA graphs on a GPU only
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really captured the model
    assert counters["stats"]["unique_graphs"] <= 3  # not one graph per batch length (train, eval)
    np.testing.assert_array_equal(eager["predictions"]["dev"], compiled["predictions"]["dev"])
    assert compiled["last_epoch_loss"] == pytest.approx(eager["last_epoch_loss"], rel=1e-4)


# ---------------------------------------------------------------------------------------------------

def test_layer_lr_decay_assigns_the_expected_rates(tmp_path):
    directory = save_tiny_bert(tmp_path / "bert3", layers=3)
    model = EncoderClassifier(directory, get_task("rte"))
    groups = parameter_groups(model, lr=1.0, weight_decay=0.01, layer_lr_decay=0.5)
    lr_of = {n: g["lr"] for g in groups for n in g["names"]}
    wd_of = {n: g["weight_decay"] for g in groups for n in g["names"]}
    assert lr_of["model.bert.embeddings.word_embeddings.weight"] == 0.5 ** 4       # below layer 0
    assert lr_of["model.bert.embeddings.LayerNorm.weight"] == 0.5 ** 4
    assert lr_of["model.bert.encoder.layer.0.attention.self.query.weight"] == 0.5 ** 3
    assert lr_of["model.bert.encoder.layer.2.output.dense.weight"] == 0.5           # the top layer
    assert lr_of["model.bert.pooler.dense.weight"] == 1.0 and lr_of["model.classifier.weight"] == 1.0
    assert wd_of["model.classifier.weight"] == 0.01 and wd_of["model.classifier.bias"] == 0.0
    assert wd_of["model.bert.encoder.layer.1.output.LayerNorm.weight"] == 0.0
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    off = parameter_groups(model, lr=2e-5, weight_decay=0.01, layer_lr_decay=1.0)
    assert {g["lr"] for g in off} == {2e-5} and len(off) == 2  # one group per (rate, decay): fewer optimizer launches
    # CLIP's naming and two stacks (the full model): each stack counts from its own top
    depths = layer_depths([
        "tower.token_embedding.weight", "tower.positional_embedding", "tower.transformer.resblocks.0.mlp.c_fc.weight",
        "tower.transformer.resblocks.1.ln_1.weight", "tower.ln_final.weight", "out.weight",
        "xd.encoder.embeddings.word_embeddings.weight", "xd.encoder.encoder.layer.0.output.dense.weight",
        "xd.encoder.encoder.layer.3.output.dense.weight", "xd.cross_layers.0.language_ffn.dense_in.weight",
    ])
    assert depths == {
        "tower.token_embedding.weight": 3, "tower.positional_embedding": 3, "tower.transformer.resblocks.0.mlp.c_fc.weight": 2,
        "tower.transformer.resblocks.1.ln_1.weight": 1, "tower.ln_final.weight": 0, "out.weight": 0,
        "xd.encoder.embeddings.word_embeddings.weight": 5, "xd.encoder.encoder.layer.0.output.dense.weight": 4,
        "xd.encoder.encoder.layer.3.output.dense.weight": 1, "xd.cross_layers.0.language_ffn.dense_in.weight": 0,
    }


def test_paper_learning_rates_by_task_and_size():
    table = {t: dict(rates) for t, rates in values("paper")["finetune"]["lr"].items()}
    assert learning_rate(table, get_task("rte"), size_of(768)) == 1e-4
    assert learning_rate(table, get_task("stsb"), size_of(1024)) == 5e-5
    assert learning_rate(table, get_task("mnli"), size_of(768)) == 2e-5
    assert learning_rate(table, get_task("swag"), size_of(1024)) == 1e-5
    with pytest.raises(PipelineError, match="finetune.lr"):
        learning_rate({"mnli": {"base": 1e-3}}, get_task("rte"), "base")
    # the full cross-modal model takes the task's `full` rate where there is one, else the encoder's
    table["rte"]["full"] = 3e-5
    assert learning_rate(table, get_task("rte"), "base", "full") == 3e-5
    assert learning_rate(table, get_task("rte"), "base", "encoder") == 1e-4
    assert learning_rate(table, get_task("stsb"), "base", "full") == 1e-4


# ---------------------------------------------------------------------------------------------------
# Results files
# ---------------------------------------------------------------------------------------------------

def test_results_have_medians_and_one_row_per_seed_split_example(bert_dir, tmp_path):
    spec = get_task("mnli")
    job = prepare("encoder", bert_dir, keyword_tables("mnli", 48, 20), settings(spec, epochs=1))
    runs = grid.run_seeds(job, [0, 1, 2])
    metrics = write_results(tmp_path / "out", job, runs, {"run": "tiny"})
    preds = pq.read_table(tmp_path / "out" / "predictions.parquet").to_pandas()
    assert len(preds) == 3 * 2 * 20 and set(preds["split"]) == {"dev_matched", "dev_mismatched"}
    assert list(preds.columns) == ["seed", "split", "idx", "prediction", "label", "correct"]
    assert (preds["correct"] == (preds["prediction"] == preds["label"])).all()
    accs = [r["metrics"]["dev_mismatched"]["accuracy"] for r in runs]
    assert metrics["median"]["dev_mismatched"]["accuracy"] == float(np.median(accs))
    assert metrics["headline"] == metrics["median"]["dev_matched"]["accuracy"]
    assert set(metrics["seeds"]) == {"0", "1", "2"} and metrics["hyperparameters"]["epochs"] == 1
    # a run with a wrong number of predictions is refused and nothing is written
    runs[1]["predictions"]["dev_matched"] = runs[1]["predictions"]["dev_matched"][:-1]
    with pytest.raises(PipelineError, match="19 predictions for 20 examples"):
        write_results(tmp_path / "bad", job, runs, {})
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------------

FINETUNE_PARAMS = {
    "lr": {t: {"base": 3e-3, "large": 3e-3} for t in ("rte", "mrpc", "sst2", "stsb")},
    "epochs": 2, "warmup_ratio": 0.1, "batch_size": 16, "eval_batch_size": 64, "max_len": 32, "weight_decay": 0.01,
    "length_group": 4, "clip_blocks_per_sentence": 2, "dropout": 0.1,
    "seeds": [0, 1], "rte_seeds": [0, 1, 2], "precision": "auto",
    "compile": False, "cuda_graph": False, "stack": 1, "models": ["xdbert"], "ablations": [], "ablation_tasks": [], "ablation_lr": None, "ablation_seeds": None,
    "full_models": [], "clip_tasks": [],
}


@pytest.fixture()
def workdir(tmp_path, bert_dir):
    """A repository-shaped folder: params.yaml, data/tasks (sst2 and stsb), models/adapted/tiny/xdbert (family tiny)."""
    (tmp_path / "models" / "adapted" / "tiny").mkdir(parents=True)
    os.symlink(bert_dir, tmp_path / "models" / "adapted" / "tiny" / "xdbert")
    write_tasks({"sst2": keyword_tables("sst2", 48, 16), "stsb": keyword_tables("stsb", 32, 12)},
                tmp_path / "data" / "tasks", "test")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "profile": "embedded", "tasks": {"names": ["sst2", "stsb"]}, "adapt": {"family": "tiny", "variants": {}},
        "families": {"tiny": {"label": "Tiny", "size": "base", "layer_lr_decay": 1.0}}, "finetune": FINETUNE_PARAMS}))
    return tmp_path


def run_stage_here(cwd: Path, args: tuple, monkeypatch, capsys, workers: int = 2) -> tuple[int, str, str]:
    """The stage script in this process (its imports are already paid), with at most `workers` Ray workers:
    (exit code, stdout, stderr)."""
    import runpy

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["stages/finetune.py", *args])
    monkeypatch.setenv("XDBERT_FINETUNE_WORKERS", str(workers))
    code = 0
    try:
        runpy.run_path(str(ROOT / "stages" / "finetune.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def outputs(workdir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(workdir)): p.read_bytes() for p in (workdir / "results" / "finetune").rglob("*") if p.is_file()}


def test_stage_writes_metrics_and_predictions(workdir, local_ray, monkeypatch, capsys):
    """Every task's runs in one grid of 2 Ray workers, its plan first and each task's medians as its last run
    ends; then the same stage with 1 worker and an empty run cache writes the same bytes, and again with
    the cache trains nothing. The run cache is in DVC's cache."""
    import subprocess

    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=workdir, check=True)
    monkeypatch.delenv(paths.RUN_CACHE_ENV, raising=False)
    cache = (workdir / ".dvc" / "cache" / paths.RUN_CACHE_NAME).resolve()
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys, workers=2)
    assert code == 0, err
    lines = [line for line in log.splitlines() if line.startswith("finetune")]
    assert lines[:3] == ["finetune sst2: tokenized for 1 model", "finetune stsb: tokenized for 1 model",
                         "finetune: plan: 4 runs, 0 reused, 4 to train on 2 workers (an estimate once the first runs end)"]
    said = {line.split(":")[0]: i for i, line in enumerate(lines)}  # where each task's median, and its summary, is
    for task in ("sst2", "stsb"):  # a task's medians come as its last run ends, after a progress line
        assert 3 < said[f"finetune {task} tiny/xdbert"] < said[f"finetune {task}"], lines
    assert "finetune: 100% of est. cost, 4/4 runs, about under 1 min left" in lines
    for task, n_dev in (("sst2", 16), ("stsb", 12)):
        out = workdir / "results" / "finetune" / task / "tiny" / "xdbert"
        metrics = yaml.safe_load((out / "metrics.json").read_text())
        assert (metrics["run"], metrics["family"], metrics["kind"], metrics["n_seeds"]) == ("tiny/xdbert", "tiny", "encoder", 2)
        assert metrics["task"] == task and metrics["metric"] == get_task(task).metric
        assert metrics["hyperparameters"]["lr"] == 3e-3 and metrics["hyperparameters"]["model_size"] == "base"
        preds = pq.read_table(out / "predictions.parquet")
        assert preds.num_rows == 2 * n_dev and sorted(set(preds.column("seed").to_pylist())) == [0, 1]
        assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "predictions.parquet"]
        assert f"finetune {task}: 0 of 2 runs reused from {cache}, 2 trained" in log
    assert "finetune stsb tiny/xdbert: median spearman" in log
    assert len(list(cache.glob("*.pt"))) == 4  # every finished run is kept by what decided it
    two = outputs(workdir)
    shutil.rmtree(cache)
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys, workers=1)
    assert code == 0 and "finetune sst2: 0 of 2 runs reused" in log, err
    assert outputs(workdir) == two  # the worker count is in no output byte
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys)
    assert code == 0 and f"finetune stsb: 2 of 2 runs reused from {cache}, 0 trained" in log, err
    assert "\nfinetune: plan: 4 runs, 4 reused, 0 to train\nfinetune sst2 tiny/xdbert: median accuracy" in log
    assert outputs(workdir) == two


def test_the_run_cache_is_where_a_variable_names_or_in_checkpoints_outside_dvc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no DVC repository here (`test_stage_writes_metrics_and_predictions`: one)
    monkeypatch.delenv(paths.RUN_CACHE_ENV, raising=False)
    assert paths.run_cache() == Path("checkpoints/runs")
    monkeypatch.setenv(paths.RUN_CACHE_ENV, str(tmp_path / "shared"))
    assert paths.run_cache() == tmp_path / "shared"


def test_a_bad_machine_setting_fails_before_any_work(workdir, monkeypatch, capsys):
    """A `RAY_ADDRESS` where nothing answers (ray.init would retry it for ever), or a runs-per-GPU count a
    CPU machine never reads: the stage says so in one line, in seconds, and the results already written
    stay."""
    import socket

    kept = workdir / "results" / "finetune" / "sst2" / "kept.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("yesterday's")
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for variable, value, says in (
            ("RAY_ADDRESS", f"127.0.0.1:{port}", f"nothing answers at 127.0.0.1:{port}"),
            ("RAY_ADDRESS", "headnode", "'headnode' is not a Ray address; allowed: HOST:PORT"),
            (engine.RUNS_PER_GPU_ENV, "four", "XDBERT_RUNS_PER_GPU='four' must be a positive number, or auto")):
        monkeypatch.setenv(variable, value)
        code, log, err = run_stage_here(workdir, (), monkeypatch, capsys)
        monkeypatch.delenv(variable)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert "finetune sst2" not in log and kept.read_text() == "yesterday's"


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


TWO_FAMILIES = {"bert": {"label": "BERT-b", "size": "base", "layer_lr_decay": 1.0},
                "electra": {"label": "ELECTRA-l", "encoder": "random:electra", "size": "large", "layer_lr_decay": 0.9}}


def test_runs_of_a_task_follow_the_tables():
    """Every family's Table 1 and Table 8 models; Table 3's ablations of `adapt.family` alone; CLIP-T once."""
    f = {"models": ["baseline", "xdbert"], "ablations": ["mlm"], "ablation_tasks": ["rte"], "full_models": ["xdbert"],
         "clip_tasks": ["rte"], "ablation_lr": None, "ablation_seeds": None}
    adapt = {"family": "bert", "variants": {"mlm": {"losses": ["mlm"]}}}
    study = Study.from_params({"finetune": f, "families": TWO_FAMILIES, "adapt": adapt})
    T1 = "table1"
    assert study.runs("rte") == [
        ("encoder", "baseline", "bert/baseline", T1, "bert"), ("encoder", "xdbert", "bert/xdbert", T1, "bert"),
        ("encoder", "mlm", "bert/mlm", T1, "bert"), ("full", "xdbert", "bert/full_xdbert", T1, "bert"),
        ("encoder", "baseline", "electra/baseline", T1, "electra"), ("encoder", "xdbert", "electra/xdbert", T1, "electra"),
        ("full", "xdbert", "electra/full_xdbert", T1, "electra"), ("clip", "clip", "clip_t", T1, "")]
    assert [r.name for r in study.runs("sst2")] == ["bert/baseline", "bert/xdbert", "bert/full_xdbert", "electra/baseline",
                                                    "electra/xdbert", "electra/full_xdbert"]
    assert [str(r.model_dir) for r in study.runs("rte")] == [
        "models/adapted/bert/baseline", "models/adapted/bert/xdbert", "models/adapted/bert/mlm", "models/crossmodal/bert/xdbert",
        "models/adapted/electra/baseline", "models/adapted/electra/xdbert", "models/crossmodal/electra/xdbert",
        "models/pretrain_clip"]
    assert study.table3_runs() == {"baseline": "bert/baseline", "xdbert": "bert/xdbert", "mlm": "bert/mlm"}  # Table 1's runs
    with pytest.raises(PipelineError, match=r"`finetune.models` names 'mlm'; every family adapts only baseline, xdbert"):
        Study.from_params({"finetune": {**f, "models": ["baseline", "mlm"]}, "families": TWO_FAMILIES, "adapt": adapt})
    with pytest.raises(PipelineError, match=r"`finetune.ablations` names 'mlm_mach', which is not an adapt variant or "
                                            r"baseline; allowed: baseline, xdbert, mlm$"):  # before any model folder is looked for
        Study.from_params({"finetune": {**f, "ablations": ["mlm_mach"]}, "families": TWO_FAMILIES, "adapt": adapt})
    with pytest.raises(PipelineError, match=r"`adapt.family` names 'roberta', which is not a family; allowed: bert, electra"):
        Study.from_params({"finetune": f, "families": TWO_FAMILIES, "adapt": {**adapt, "family": "roberta"}})


def test_a_family_gives_its_size_class_and_layer_decay(bert_dir):
    """ELECTRA-l's recipe: Table 5's large rate and a decay of 0.9, whatever the width of the model at hand."""
    spec = get_task("sst2")
    s = dataclasses.replace(settings(spec), lr={"sst2": {"base": 1e-4, "large": 1e-5}})
    large = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), s, family=family(
        {"families": TWO_FAMILIES, "adapt": {"family": "bert"}}, "electra"))
    assert (large.size, large.hyperparameters.lr, large.hyperparameters.layer_lr_decay) == ("large", 1e-5, 0.9)
    plain = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), s)  # no family: the width decides, no decay
    assert (plain.size, plain.hyperparameters.lr, plain.hyperparameters.layer_lr_decay) == ("base", 1e-4, 1.0)


def test_table3_protocol_of_the_paper_reruns_its_rows_at_one_rate_and_five_seeds():
    """The paper ran every ablation at lr 1e-4 with 5 runs, CoLA (Table 1: 2e-5) and RTE (Table 1: 9 seeds) too."""
    p = values("paper")
    cola, rte = FinetuneSettings.from_params(p, get_task("cola")), FinetuneSettings.from_params(p, get_task("rte"))
    study = cola.study
    assert (study.protocol.lr, study.protocol.seeds) == (1e-4, [0, 1, 2, 3, 4])
    runs = {r.name: r for r in study.runs("cola")}
    assert runs["bert-b/xdbert"].protocol == "table1" and runs["bert-b/table3_xdbert"].protocol == "ablation"
    assert runs["bert-b/table3_baseline"].model_dir == Path("models/adapted/bert-b/baseline")
    assert runs["bert-b/mlm_match"].protocol == runs["bert-b/twenty_epochs"].protocol == "ablation"
    assert "bert-b/table3_xdbert" not in {r.name for r in study.runs("sst2")}  # only on the ablation tasks
    assert not any(r.name.startswith("electra") and r.protocol == "ablation" for r in runs.values())  # BERT-b's alone
    assert cola.hyperparameters("base", "encoder").lr == 2e-5                 # Table 1's CoLA rate
    assert cola.hyperparameters("base", "encoder", "ablation").lr == 1e-4     # Table 3's
    assert rte.seeds_of(runs["bert-b/xdbert"]) == list(range(9)) and rte.seeds_of(runs["bert-b/table3_xdbert"]) == [0, 1, 2, 3, 4]
    assert study.table3_runs()["baseline"] == "bert-b/table3_baseline" and study.table3_runs()["mlm"] == "bert-b/mlm"


def test_compile_auto_compiles_on_a_gpu_only(bert_dir, monkeypatch):
    """`finetune.compile: auto` (the paper profile's) trains eagerly on the CPU, where compiling costs
    more than a run wins back, and compiles on a GPU, where CUDA graphs pay (bench/results/h200)."""
    def refuse(*a, **kw):
        raise AssertionError("compiled on the CPU")

    monkeypatch.setattr(torch, "compile", refuse)
    spec = get_task("sst2")
    tables = keyword_tables("sst2", 16, 8)
    train_seed(prepare("encoder", bert_dir, tables, settings(spec, epochs=1, compile="auto")), 0)
    assert [training.compiles(setting, device) for setting in ("auto", True, False) for device in ("cpu", "cuda")] == \
        [False, True, True, True, False, False]


@pytest.mark.parametrize("args, change, message", [
    ((), {"names": ["boolq"]}, "unknown entry of `tasks.names` 'boolq'; allowed: rte, mrpc"),
    ((), {"models": ["missing"]}, "`finetune.models` names 'missing'; every family adapts only baseline, xdbert"),
    ((), {"models": ["baseline"]}, "model folder models/adapted/tiny/baseline is missing"),
    ((), {"adapt": {"family": "bert", "variants": {}}}, "`adapt.family` names 'bert', which is not a family; allowed: tiny"),
    ((), {"seeds": []}, "`finetune.seeds` must be a non-empty list"),
    ((), {"families": {"tiny": {"label": "Tiny", "size": "base", "layer_lr_decay": 0}}},
     "`families.tiny.layer_lr_decay` must be in (0, 1]"),
    ((), {"families": {"tiny": {"label": "Tiny", "size": "xl", "layer_lr_decay": 1.0}}},
     "unknown families.tiny.size 'xl'; allowed: base, large"),
    ((), {"compile": "yes"}, "`finetune.compile` must be true, false or auto (on a GPU only); got 'yes'"),
    ((), {"names": ["sst2", "mrpc"]}, "task mrpc lacks split file(s)"),
    ((), {"names": ["rte"], "rte_seeds": []}, "`finetune.rte_seeds` must be a non-empty list"),
    ((), {"lr": {"sst2": {"base": 1e-3}}}, "`finetune.lr.sst2.large` must be a positive number"),
    ((), {"lr": {"rte": {"base": 1e-3, "large": 1e-3}}}, "`finetune.lr.sst2` must map base, large"),
    ((), {"lr": {"sst2": 1e-3}}, "`finetune.lr.sst2` must map base, large (and optionally full"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3, "full": 0}}}, "`finetune.lr.sst2.full` must be a positive number"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3, "xl": 1e-3}}}, "`finetune.lr.sst2` has unknown keys ['xl']; allowed: base, large, full"),
    ((), {"full_models": ["xdbert"]}, "model folder models/crossmodal/tiny/xdbert is missing"),
    # every task's rates are checked, and the table names tasks only
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3}, "rte": {"base": "fast", "large": 1e-3}}},
     "`finetune.lr.rte.base` must be a positive number; got 'fast'"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3}, "rtee": {"base": 1e-3, "large": 1e-3}}},
     "unknown entry of `finetune.lr` 'rtee'; allowed: rte, mrpc"),
    ((), {"ablation_tasks": ["boolq"]}, "unknown entry of `finetune.ablation_tasks` 'boolq'"),
    ((), {"ablation_tasks": ["rte"]}, "unknown entry of `finetune.ablation_tasks` 'rte'; allowed: sst2, stsb"),  # not in tasks.names
    ((), {"ablation_lr": 0}, "`finetune.ablation_lr` must be a positive number"),
    ((), {"ablation_seeds": [1, 1]}, "`finetune.ablation_seeds` must list distinct integers"),
    (("sst2",), None, "usage: python stages/finetune.py (no arguments: it reads params.yaml); got 'sst2'"),
])
def test_stage_rejects_bad_input_before_any_work(workdir, args, change, message, monkeypatch, capsys):
    if change:
        p = yaml.safe_load((workdir / "params.yaml").read_text())
        p["finetune"].update({k: v for k, v in change.items() if k not in ("names", "adapt", "families")})
        p.update({k: v for k, v in change.items() if k in ("adapt", "families")})
        p["tasks"]["names"] = change.get("names", p["tasks"]["names"])
        (workdir / "params.yaml").write_text(yaml.safe_dump(p))
    code, _, err = run_stage_here(workdir, args, monkeypatch, capsys)
    assert code == 2, err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1
    assert not (workdir / "results").exists()


def test_stage_fails_on_a_missing_split_file(workdir, monkeypatch, capsys):
    (workdir / "data" / "tasks" / "sst2" / "dev.parquet").unlink()
    code, _, err = run_stage_here(workdir, (), monkeypatch, capsys)
    assert code == 2 and "data/tasks/sst2/dev.parquet" in err and "it needs train, dev" in err
    assert not (workdir / "results").exists()


# ---------------------------------------------------------------------------------------------------
# The full cross-modal model and CLIP's tower alone
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crossmodal_dirs(tmp_path_factory, bert_dir):
    from transformers import AutoTokenizer

    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import save_clip_tower, save_full

    root = tmp_path_factory.mktemp("xmodels")
    torch.manual_seed(0)
    vocab = len(AutoTokenizer.from_pretrained(bert_dir))  # the full model reads the test tokenizer's ids
    config = XDBertConfig(encoder="random:bert", vocab_size=vocab, clip="xdbert-tiny", clip_heads=2, cross_layers=1,
                          encoder_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                          "intermediate_size": 64, "max_position_embeddings": 64})
    save_full(XDBertModel.build(config), root / "full")
    save_clip_tower(CLIPTextTower.build("xdbert-tiny"), root / "clip", clip="xdbert-tiny")
    return root


@pytest.mark.parametrize("kind, task", [("full", "sst2"), ("full", "swag"), ("clip", "stsb"), ("clip", "swag")])
def test_full_and_clip_kinds_finetune_end_to_end(crossmodal_dirs, bert_dir, kind, task):
    spec = get_task(task)
    job = prepare(kind, crossmodal_dirs / kind, keyword_tables(task, 32, 12), settings(spec, epochs=1),
                     tokenizer_dir=bert_dir)
    blocks = job.data["train"].clip_ids
    n_sentences = 2 if spec.pair else 1
    assert blocks.shape == (32, spec.num_labels if spec.kind == "multiple_choice" else 1, 2 * n_sentences, 77)
    assert (blocks[:, :, ::2, 0] == 49406).all()  # every sentence starts its own blocks with [SOT]
    run = train_seed(job, 0)
    pred = run["predictions"]["dev"]
    assert pred.shape == (12,) and np.isfinite(run["last_epoch_loss"])
    again = train_seed(job, 0)
    np.testing.assert_array_equal(pred, again["predictions"]["dev"])


@pytest.mark.parametrize("kind, task", [("full", "swag"), ("clip", "stsb")])
def test_the_clip_layout_found_on_the_host_trains_the_same_bits(crossmodal_dirs, bert_dir, monkeypatch, kind, task):
    """Batches of the `full` and `clip` kinds say which CLIP blocks hold tokens (found on the host, where
    reading them costs no wait for the GPU); a run trains exactly what it trained when the model found it."""
    spec = get_task(task)
    job = prepare(kind, crossmodal_dirs / kind, keyword_tables(task, 32, 12), settings(spec, epochs=1),
                  tokenizer_dir=bert_dir)
    batch = loop.host_batch(job, job.data["train"], np.arange(8), 1)
    ids = torch.from_numpy(batch["clip_ids"]).reshape(-1, *batch["clip_ids"].shape[-2:])
    expected = ClipLayout.of(clip_block_mask(ids, job.eot_id))
    layout = batch["clip_layout"]
    assert torch.equal(layout.rows, expected.rows) and layout.length == expected.length
    assert len(layout.rows) < len(ids) * ids.shape[1]  # some blocks are unused, so the layout matters
    located = loop.train_seed(job, 0)
    monkeypatch.setattr(loop, "host_batch", lambda job, data, rows, multiple: fd.collate(data, rows, multiple))
    found = loop.train_seed(job, 0)
    assert located["first_epoch_loss"] == found["first_epoch_loss"]
    np.testing.assert_array_equal(located["predictions"]["dev"], found["predictions"]["dev"])


@pytest.mark.parametrize("kind, task", [("full", "mnli"), ("clip", "swag")])
def test_rounding_the_clip_layout_up_to_8_changes_no_score(crossmodal_dirs, bert_dir, kind, task):
    """On a GPU the CLIP layout is rounded as batch lengths are (`pad_multiple`): every block of a block
    position some window uses is run, to a length that is a multiple of 8, so that a task's batches come
    in few shapes (each shape of a recorded step is a graph of its own). What it adds holds no token: the
    scores are the same."""
    spec = get_task(task)
    rows = keyword_rows(task, 96, 0)
    for i in range(0, 96, 9):  # some first sentences longer than a CLIP block: their second block is used
        rows["text_a"][i] += " " + " ".join(FILLER[j % len(FILLER)] for j in range(80))
    tables = {split: to_table(spec, rows) for split in spec.splits}
    job = prepare(kind, crossmodal_dirs / kind, tables, settings(spec), tokenizer_dir=bert_dir)
    data = job.data["train"]
    torch.manual_seed(0)
    model = build_model(job).eval()
    shapes: dict[int, set] = {1: set(), 8: set()}
    for batch_rows in fd.length_grouped_batches(data.lengths, 8, 0, 0, 4):
        batches = {m: loop.host_batch(job, data, batch_rows, m) for m in shapes}
        exact, rounded = batches[1]["clip_layout"], batches[8]["clip_layout"]
        assert rounded.length % 8 == 0 or rounded.length == 77
        assert set(exact.rows.tolist()) <= set(rounded.rows.tolist())
        assert rounded.kept is None or set(exact.kept.tolist()) <= set(rounded.kept.tolist())
        for m, b in batches.items():
            shapes[m].add((b["input_ids"].shape if "input_ids" in b else None, b["clip_layout"].shape))
        with torch.no_grad():
            scores = [model(training.to_device(b, "cpu")) for b in batches.values()]
        torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)
    assert len(shapes[8]) < len(shapes[1])


@pytest.mark.parametrize("kind", ["full", "clip"])
def test_only_the_tasks_clip_rows_are_trained_and_nothing_else_changes(crossmodal_dirs, bert_dir, monkeypatch, kind):
    spec = get_task("stsb")
    job = prepare(kind, crossmodal_dirs / kind, keyword_tables("stsb", 48, 16), settings(spec, epochs=2),
                     tokenizer_dir=bert_dir)
    used = np.unique(np.concatenate([d.clip_ids.ravel() for d in job.data.values()]))
    assert {0, 49406, 49407} <= set(used.tolist()) and len(used) < 1000
    torch.manual_seed(0)
    model = build_model(job)
    table = model.xd.clip.token_embedding if kind == "full" else model.tower.token_embedding
    assert isinstance(table, RowSubsetEmbedding) and table.weight.shape == (len(used), 64)
    name = "xd.clip.token_embedding.weight" if kind == "full" else "tower.token_embedding.weight"
    assert dict(model.named_parameters())[name] is table.weight  # the name layer_lr_decay reads is kept
    with pytest.raises(IndexError):  # an id no split holds has no row
        table(torch.tensor([int(np.setdiff1d(np.arange(49408), used)[0])]))
    # Trained with the whole table instead: the same losses and predictions.
    subset = train_seed(job, 0)
    monkeypatch.setattr(job_module, "RowSubsetEmbedding", lambda full, ids: full)
    whole = train_seed(job, 0)
    np.testing.assert_array_equal(subset["predictions"]["dev"], whole["predictions"]["dev"])
    assert subset["last_epoch_loss"] == pytest.approx(whole["last_epoch_loss"], rel=1e-5)


def test_full_kind_without_a_tokenizer_folder_names_it(crossmodal_dirs):
    with pytest.raises(PipelineError, match="pass tokenizer_dir"):
        prepare("full", crossmodal_dirs / "full", keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
