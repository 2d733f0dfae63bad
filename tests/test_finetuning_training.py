"""Training one seed (xdbert.finetuning.compute.loop): each task kind learns, seeds reproduce, fp16, the NaN
guard, compiling."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keyword_tasks import keyword_tables, settings
from xdbert import training
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import loop
from xdbert.finetuning.compute.job import build_model
from xdbert.finetuning.compute.loop import train_seed
from xdbert.finetuning.control import grid
from xdbert.finetuning.control.prepare import prepare

pytestmark = pytest.mark.usefixtures("one_thread")


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


@pytest.mark.slow
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
