"""A finetuning step recorded whole as a CUDA graph (`finetune.cuda_graph`), checked on the CPU: what the
recording does to a run (nothing, on a CPU), the learning rates a recorded AdamW reads, and the replay's
bookkeeping with a stand-in for the graph."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_finetuning import bert_dir, keyword_tables, settings  # noqa: F401 (fixtures)
from xdbert import training
from xdbert.data.tasks.registry import get_task
from xdbert.finetuning import graphed
from xdbert.finetuning.job import prepare
from xdbert.finetuning.stacked import train_group

pytestmark = pytest.mark.usefixtures("one_thread")


def result_bytes(r: dict) -> tuple:
    return (r["first_epoch_loss"], r["last_epoch_loss"], r["metrics"],
            {split: p.tobytes() for split, p in r["predictions"].items()})


@pytest.mark.parametrize("group", [(0,), (0, 1)], ids=["alone", "stacked"])
def test_a_cpu_run_ignores_cuda_graph(bert_dir, group):
    """Recording is a GPU's: on the CPU `cuda_graph: true` trains the same bytes as false."""
    spec = get_task("sst2")
    s = settings(spec, epochs=2, stack=len(group))
    runs = {flag: train_group(prepare("encoder", bert_dir, keyword_tables("sst2", 96, 32),
                                      dataclasses.replace(s, cuda_graph=flag)), group)
            for flag in (False, True)}
    assert [result_bytes(r) for r in runs[True]] == [result_bytes(r) for r in runs[False]]
    assert not graphed.records(True, "cpu", "no")
    assert not graphed.records(True, "cuda", "fp16")  # loss scaling decides on the host
    assert graphed.records(True, "cuda", "bf16") and not graphed.records(False, "cuda", "bf16")


def test_only_encoders_are_recorded():
    """The clip and full kinds read the CLIP tower's used blocks and length on the host, which a recording
    cannot: their runs say `cuda_graph: false` whatever the section says."""
    s = settings(get_task("sst2"), cuda_graph=True)
    assert s.hyperparameters("base", "encoder").cuda_graph is True
    assert s.hyperparameters("base", "clip").cuda_graph is False and s.hyperparameters("base", "full").cuda_graph is False
    assert settings(get_task("sst2")).hyperparameters("base", "encoder").cuda_graph is False


def train_small(tensor_rates: bool, steps: int = 30) -> tuple[list[torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))
    optimizer, schedule = training.optimizer_and_schedule(model, 1e-2, 0.01, 0.2, steps)
    if tensor_rates:
        graphed.tensor_learning_rates(optimizer)
    x, rates = torch.randn(16, 4), []
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        rates.append(float(optimizer.param_groups[0]["lr"]))
    return [p.detach().clone() for p in model.parameters()], rates


def test_tensor_learning_rates_follow_the_schedule():
    """A recorded AdamW reads its rates from tensors that the schedule fills in place each step: the same
    warmup and decay as floats (up to fp32's rounding of each rate), hence the same training."""
    floats, float_rates = train_small(False)
    tensors, tensor_rates = train_small(True)
    assert tensor_rates == pytest.approx(float_rates, rel=1e-6, abs=1e-12)
    assert max(tensor_rates) == pytest.approx(1e-2, rel=1e-6) and tensor_rates[-1] == 0.0
    for a, b in zip(floats, tensors):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class StandInGraph:
    """A recorded step on the CPU: recording computed nothing; a replay runs the step on the recorded
    inputs and writes its loss into the recorded loss tensor, as a CUDA graph's replay does."""

    def __init__(self, step, inputs, loss):
        self.step, self.inputs, self.loss = step, inputs, loss
        self.replays = 0

    def replay(self):
        self.loss.copy_(self.step(self.inputs))
        self.replays += 1


@pytest.mark.parametrize("group", [(0,), (0, 1)], ids=["alone", "stacked"])
def test_replayed_steps_train_as_eager_ones(bert_dir, monkeypatch, group):
    """Each batch shape's first step runs eagerly and is recorded; every later batch of that shape is copied
    into the recording's inputs and replayed. With a stand-in for the graph, the run trains as an eager one
    (up to the rounding of each rate to fp32), which it would not if a replay read the recorded batch, or if
    the epoch's losses shared the recording's loss tensor."""
    graphs: list[StandInGraph] = []

    def recorded(self, batch):
        inputs = {name: t.clone() for name, t in batch.items()}
        graphs.append(StandInGraph(self.step, inputs, torch.zeros(len(group)) if len(group) > 1 else torch.zeros(())))
        return graphs[-1], inputs, graphs[-1].loss

    monkeypatch.setattr(graphed, "records", lambda setting, device, precision: setting)
    monkeypatch.setattr(graphed.torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(graphed.torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(graphed.GraphedStep, "_eager_step", lambda self, batch: self.step(batch))
    monkeypatch.setattr(graphed.GraphedStep, "_recorded", recorded)
    spec = get_task("sst2")
    s = settings(spec, epochs=3, stack=len(group))
    tables = keyword_tables("sst2", 96, 32)
    eager, replayed = (train_group(prepare("encoder", bert_dir, tables, dataclasses.replace(s, cuda_graph=flag)), group)
                       for flag in (False, True))
    replays = sum(g.replays for g in graphs)
    assert replays + len(graphs) == replayed[0]["steps"] and replays > len(graphs)  # each shape's first step: eager
    for a, b in zip(eager, replayed):
        assert b["first_epoch_loss"] == pytest.approx(a["first_epoch_loss"], rel=1e-5)
        assert b["last_epoch_loss"] == pytest.approx(a["last_epoch_loss"], rel=1e-4)
        assert b["metrics"]["dev"]["accuracy"] == pytest.approx(a["metrics"]["dev"]["accuracy"], abs=0.05)


class HostTraffic(TorchDispatchMode):
    """Notes every operation that a CUDA graph cannot record: a tensor built from host values
    (`torch.tensor(x, device=...)`, a copy to the GPU) and a tensor's value read on the host (`.item()`,
    `bool(t)`, a wait for the GPU)."""
    HOST_OPS = ("aten.lift_fresh", "aten._local_scalar_dense")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.HOST_OPS):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("group", [(0,), (0, 1)], ids=["alone", "stacked"])
@pytest.mark.parametrize("task", ["sst2", "swag"])
def test_a_recorded_step_moves_nothing_between_host_and_device(bert_dir, monkeypatch, group, task):
    """A step is recorded as it runs: the recording runs it here on the CPU, and no operation of it may
    need the host. transformers' eager attention mask did before 5.21 (a scalar copied to the GPU), which
    stopped the first GPU run of a recorded stack (bench/results/h200)."""
    traffic = HostTraffic()

    def recorded(self, batch):
        inputs = {name: t.clone() for name, t in batch.items()}
        with traffic:
            loss = self.step(inputs)
        return StandInGraph(self.step, inputs, loss), inputs, loss

    monkeypatch.setattr(graphed, "records", lambda setting, device, precision: setting)
    monkeypatch.setattr(graphed.torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(graphed.torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(graphed.GraphedStep, "_eager_step", lambda self, batch: self.step(batch))
    monkeypatch.setattr(graphed.GraphedStep, "_recorded", recorded)
    s = dataclasses.replace(settings(get_task(task), epochs=1, stack=len(group)), cuda_graph=True)
    train_group(prepare("encoder", bert_dir, keyword_tables(task, 64, 32), s), group)
    assert traffic.seen == []
