"""Several seeds trained as one stacked model (`finetune.stack`): what each seed computes, and the grid's groups."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import BertConfig

from keyword_tasks import keyword_tables, save_tiny_bert, settings
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import keys
from xdbert.finetuning.compute.loop import train_seed
from xdbert.finetuning.compute.stacked import clip_per_seed, stack_batches, train_stack
from xdbert.finetuning.control import grid
from xdbert.finetuning.control.prepare import prepare
from xdbert.finetuning.control.results import summarize
from xdbert.finetuning.control.settings import FinetuneSettings
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def no_dropout_dir(tmp_path_factory):
    """Without dropout a seed's computation is the same stacked or alone: only rounding may differ."""
    directory = save_tiny_bert(tmp_path_factory.mktemp("bert") / "no_dropout")
    config = BertConfig.from_pretrained(directory)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("task", ["sst2", "swag"])
def test_a_stacked_seed_computes_what_it_computes_alone(no_dropout_dir, task):
    """Each seed keeps its head, batch order, loss, clipping and AdamW state; SWAG's choices too."""
    spec = get_task(task)
    job = prepare("encoder", no_dropout_dir, keyword_tables(task, 100, 48), settings(spec, epochs=3, stack=3))
    stacked = train_stack(job, [0, 1, 2])
    for r in stacked:
        alone = train_seed(job, r["seed"])
        assert r["stacked_with"] == [0, 1, 2]
        assert r["first_epoch_loss"] == pytest.approx(alone["first_epoch_loss"], rel=1e-5)
        assert r["last_epoch_loss"] == pytest.approx(alone["last_epoch_loss"], rel=1e-4)
        np.testing.assert_array_equal(r["predictions"]["dev"], alone["predictions"]["dev"])
        assert r["metrics"] == alone["metrics"]
    assert len({r["first_epoch_loss"] for r in stacked}) == 3  # three seeds, three heads and orders


def test_a_stack_learns_reproduces_and_its_seeds_differ(bert_dir):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2"), settings(spec, stack=2))
    first, second = train_stack(job, [0, 1])
    again = train_stack(job, [0, 1])[0]
    for r in (first, second):
        assert r["metrics"]["dev"]["accuracy"] >= 0.9, r["metrics"]
        assert r["last_epoch_loss"] < 0.5 * r["first_epoch_loss"]
    assert first["predictions"]["dev"].tobytes() == again["predictions"]["dev"].tobytes()
    assert (first["first_epoch_loss"], first["last_epoch_loss"]) == (again["first_epoch_loss"], again["last_epoch_loss"])
    assert first["last_epoch_loss"] != second["last_epoch_loss"]
    # the dropout stream is the stack's: seed 0 stacked with another seed trains otherwise
    assert train_stack(job, [0, 2])[0]["last_epoch_loss"] != first["last_epoch_loss"]


def test_gradients_are_clipped_per_seed():
    torch.manual_seed(0)
    stacked = [torch.nn.Parameter(torch.zeros(3, 4, 5)), torch.nn.Parameter(torch.zeros(3, 7))]
    scale = torch.tensor([0.01, 1.0, 10.0])
    grads = [torch.randn(3, 4, 5) * scale.view(3, 1, 1), torch.randn(3, 7) * scale.view(3, 1)]
    for p, g in zip(stacked, grads):
        p.grad = g.clone()
    norms = clip_per_seed(stacked, 1.0)
    for k in range(3):
        alone = [torch.nn.Parameter(torch.zeros_like(g[k])) for g in grads]
        for p, g in zip(alone, grads):
            p.grad = g[k].clone()
        norm = torch.nn.utils.clip_grad_norm_(alone, 1.0)
        assert norms[k].item() == pytest.approx(norm.item(), rel=1e-6)
        for p, q in zip(stacked, alone):
            torch.testing.assert_close(p.grad[k], q.grad)
    assert norms[0] < 1.0 < norms[2]  # seed 0 kept its gradient, seed 2's was scaled down


def test_stacked_batches_pad_lengths_with_pad_ids_and_rows_with_copies(bert_dir):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 40, 8), settings(spec))
    train = job.data["train"]
    short = np.argsort(train.lengths)[:3]
    long = np.argsort(train.lengths)[-5:]
    batch, sizes = stack_batches(train, [short, long], multiple=1)
    assert sizes == [3, 5]
    length = int(train.lengths[long].max())
    assert batch["input_ids"].shape == (2, 5, length) and batch["labels"].shape == (2, 5)
    assert (batch["attention_mask"][0, :3].sum(1) == train.lengths[short]).all()
    assert (batch["input_ids"][0, :3][batch["attention_mask"][0, :3] == 0] == train.pad_ids["input_ids"]).all()
    np.testing.assert_array_equal(batch["input_ids"][0, 3:], np.repeat(batch["input_ids"][0, :1], 2, axis=0))
    filled, _ = stack_batches(train, [short, long], multiple=8, size=16)
    assert filled["input_ids"].shape == (2, 16, -(-length // 8) * 8)


@pytest.mark.slow
def test_the_grid_trains_seeds_in_stacks_and_keys_each_run_by_its_stack(bert_dir, local_ray, tmp_path):
    spec = get_task("sst2")
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 64, 32), settings(spec, epochs=1, stack=2))
    assert keys.groups(job, [4, 0, 2]) == [(4, 0), (2,)]
    job.run_cache = str(tmp_path / "runs")
    (results,) = grid.run_grid([(job, [4, 0, 2])], workers=2)  # a stack and a single run, on Ray workers
    expected = [*train_stack(job, [4, 0]), train_seed(job, 2)]
    assert [r["seed"] for r in results] == [4, 0, 2] and [r["reused"] for r in results] == [False] * 3
    for r, e in zip(results, expected):
        assert r["predictions"]["dev"].tobytes() == e["predictions"]["dev"].tobytes()
    per_seed = summarize(job, results)["seeds"]  # metrics.json says which seeds shared a stack
    assert per_seed["4"]["stacked_with"] == [4, 0] and "stacked_with" not in per_seed["2"]
    assert keys.run_key(job, 4, "cpu", (4, 0)) != keys.run_key(job, 4, "cpu", (4, 2))
    assert [r["reused"] for r in grid.run_seeds(job, [4, 0, 2])] == [True] * 3
    # another seed list regroups the seeds: the runs whose stack changed train again
    assert [r["reused"] for r in grid.run_seeds(job, [4, 2, 0])] == [False, False, False]


def test_only_encoders_stack_and_stack_must_be_positive(bert_dir):
    spec = get_task("sst2")
    s = settings(spec, stack=4)
    assert s.hyperparameters("base", "encoder").stack == 4
    assert s.hyperparameters("base", "clip").stack == 1 and s.hyperparameters("base", "full").stack == 1
    job = prepare("encoder", bert_dir, keyword_tables("sst2", 32, 8), s)
    with pytest.raises(PipelineError, match="trains `encoder` models only, not `full`"):
        train_stack(dataclasses.replace(job, model_kind="full"), [0, 1])
    p = values("embedded")
    p["finetune"]["stack"] = 0
    with pytest.raises(PipelineError, match="finetune.stack"):
        FinetuneSettings.from_params(p, spec)


@pytest.mark.slow
def test_a_compiled_stack_matches_the_eager_one(no_dropout_dir):
    """Lengths in buckets of 32 and full batches: one compiled training graph for these short examples."""
    spec = get_task("sst2")
    tables = keyword_tables("sst2", 64, 32)
    eager = train_stack(prepare("encoder", no_dropout_dir, tables, settings(spec, epochs=2)), [0, 1])
    compiled = train_stack(prepare("encoder", no_dropout_dir, tables, settings(spec, epochs=2, compile=True)), [0, 1])
    for a, b in zip(eager, compiled):
        assert a["last_epoch_loss"] == pytest.approx(b["last_epoch_loss"], rel=1e-3)
        assert np.mean(a["predictions"]["dev"] == b["predictions"]["dev"]) >= 0.9
