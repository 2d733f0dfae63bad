"""A finetuning step recorded whole as a CUDA graph (`finetune.cuda_graph`), checked on the CPU: what the
recording does to a run (nothing, on a CPU), the learning rates a recorded AdamW reads, and the replay's
bookkeeping with a stand-in for the graph."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from keyword_tasks import keyword_tables, settings
from xdbert import training
from xdbert.data.tasks.registry import get_task
from xdbert.finetuning.compute import graphed, loop, stacked
from xdbert.finetuning.compute.stacked import train_group
from xdbert.finetuning.control.prepare import prepare
from xdbert.model.clip_tower import ClipLayout

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


def test_every_kind_is_recorded_and_only_encoders_stacked():
    """The clip and full kinds' batches carry their CLIP layout, found on the host (`ClipLayout`), so their
    steps are recorded too; their seeds' layouts differ, so they are never stacked."""
    s = settings(get_task("sst2"), cuda_graph=True, stack=2)
    for kind in ("encoder", "clip", "full"):
        assert s.hyperparameters("base", kind).cuda_graph is True
    assert s.hyperparameters("base", "encoder").stack == 2
    assert s.hyperparameters("base", "clip").stack == 1 and s.hyperparameters("base", "full").stack == 1
    assert settings(get_task("sst2")).hyperparameters("base", "full").cuda_graph is False


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


def stand_in(loss: torch.Tensor):
    """A `GraphedStep._recorded` that records into a `StandInGraph` whose replays write a copy of `loss`,
    and the list of the graphs it made."""
    graphs: list[StandInGraph] = []

    def recorded(self, batch):
        inputs = {name: t.clone() for name, t in batch.items()}
        graphs.append(StandInGraph(self.step, inputs, loss.clone()))
        return graphs[-1], inputs, graphs[-1].loss

    return recorded, graphs


@pytest.fixture
def recording_on_the_cpu(monkeypatch):
    """Runs record their steps here as on a GPU, batch lengths and CLIP layouts rounded up to 8 as there;
    the test sets `GraphedStep._recorded`, which records on a GPU."""
    monkeypatch.setattr(graphed, "records", lambda setting, device, precision: setting)
    monkeypatch.setattr(graphed.torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(graphed.torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(graphed.GraphedStep, "_eager_step", lambda self, batch: self.step(batch))
    for module in (loop, stacked):
        monkeypatch.setattr(module, "pad_multiple", lambda max_len, device: 8)


# Every kind, alone; an encoder's seeds stacked too. The kind's model folder, its task, the seeds.
KINDS = [("encoder", "sst2", (0,)), ("encoder", "sst2", (0, 1)), ("encoder", "swag", (0,)), ("encoder", "swag", (0, 1)),
         ("full", "sst2", (0,)), ("full", "swag", (0,)), ("clip", "stsb", (0,))]
KIND_IDS = [f"{kind}-{task}-{'stacked' if len(group) > 1 else 'alone'}" for kind, task, group in KINDS]


def job_of(kind: str, task: str, group: tuple, bert_dir, crossmodal_dirs, n_train: int, **changes):
    path = bert_dir if kind == "encoder" else crossmodal_dirs / kind
    s = settings(get_task(task), stack=len(group), **changes)
    return prepare(kind, path, keyword_tables(task, n_train, 32), s, tokenizer_dir=bert_dir)


@pytest.mark.parametrize("kind, task, group", KINDS, ids=KIND_IDS)
def test_replayed_steps_train_as_eager_ones(bert_dir, crossmodal_dirs, monkeypatch, recording_on_the_cpu, kind, task, group):
    """Each batch shape's first step runs eagerly and is recorded; every later batch of that shape is copied
    into the recording's inputs (the CLIP layout's blocks and positions too) and replayed. With a stand-in
    for the graph, the run trains as an eager one (up to the rounding of each rate to fp32), which it would
    not if a replay read the recorded batch, or if the epoch's losses shared the recording's loss tensor."""
    recorded, graphs = stand_in(torch.zeros(len(group)) if len(group) > 1 else torch.zeros(()))
    monkeypatch.setattr(graphed.GraphedStep, "_recorded", recorded)
    eager, replayed = (train_group(job_of(kind, task, group, bert_dir, crossmodal_dirs, 96, epochs=3, cuda_graph=flag), group)
                       for flag in (False, True))
    replays = sum(g.replays for g in graphs)
    assert replays + len(graphs) == replayed[0]["steps"] and replays > len(graphs)  # each shape's first step: eager
    metric = get_task(task).metric
    for a, b in zip(eager, replayed):
        assert b["first_epoch_loss"] == pytest.approx(a["first_epoch_loss"], rel=1e-5)
        assert b["last_epoch_loss"] == pytest.approx(a["last_epoch_loss"], rel=1e-4)
        assert b["metrics"]["dev"][metric] == pytest.approx(a["metrics"]["dev"][metric], abs=0.05)


def test_a_replay_reads_its_own_batchs_clip_layout(recording_on_the_cpu, monkeypatch):
    """Two batches whose rounded CLIP layouts have one shape but run other blocks (a long first sentence,
    a long second one) share a recording: the replay must read the second batch's blocks and positions."""
    recorded, graphs = stand_in(torch.zeros((), dtype=torch.long))
    monkeypatch.setattr(graphed.GraphedStep, "_recorded", recorded)

    def layout(long_sentence: int) -> ClipLayout:
        mask = torch.zeros(2, 4, 77, dtype=torch.bool)  # 2 pairs, 2 blocks a sentence
        mask[:, (0, 2), :20] = True
        mask[0, 2 * long_sentence + 1, :5] = True
        return ClipLayout.of(mask, 8)

    def step(batch):  # a number that tells the layouts apart
        return batch["clip_layout"].rows @ torch.arange(6) + batch["clip_layout"].kept.sum()

    first, second = layout(0), layout(1)
    assert first.shape == second.shape and not torch.equal(first.rows, second.rows)
    graphed_step = graphed.GraphedStep(step, torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]), record=True)
    assert graphed_step({"clip_layout": first}) == step({"clip_layout": first})  # eager, then recorded
    assert graphed_step({"clip_layout": second}) == step({"clip_layout": second}) and graphs[0].replays == 1


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


@pytest.mark.parametrize("kind, task, group", KINDS, ids=KIND_IDS)
def test_a_recorded_step_moves_nothing_between_host_and_device(bert_dir, crossmodal_dirs, monkeypatch, recording_on_the_cpu,
                                                               kind, task, group):
    """A step is recorded as it runs: the recording runs it here on the CPU, and no operation of it may
    need the host. transformers' eager attention mask did before 5.21 (a scalar copied to the GPU), which
    stopped the first GPU run of a recorded stack (bench/results/h200)."""
    traffic = HostTraffic()

    def recorded(self, batch):
        inputs = {name: t.clone() for name, t in batch.items()}
        with traffic:
            loss = self.step(inputs)
        return StandInGraph(self.step, inputs, loss), inputs, loss

    monkeypatch.setattr(graphed.GraphedStep, "_recorded", recorded)
    train_group(job_of(kind, task, group, bert_dir, crossmodal_dirs, 64, epochs=1, cuda_graph=True), group)
    assert traffic.seen == []
