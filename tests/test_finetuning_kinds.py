"""The full cross-modal model and CLIP's tower alone, finetuned: end to end, their CLIP layout and
embedding rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keyword_tasks import FILLER, keyword_rows, keyword_tables, settings
from xdbert import training
from xdbert.clip import clip_block_mask
from xdbert.data.tasks.registry import get_task, to_table
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute import job as job_module
from xdbert.finetuning.compute import loop
from xdbert.finetuning.compute.heads import RowSubsetEmbedding
from xdbert.finetuning.compute.job import build_model
from xdbert.finetuning.compute.loop import train_seed
from xdbert.finetuning.control.prepare import prepare
from xdbert.model.clip_tower import ClipLayout

pytestmark = pytest.mark.usefixtures("one_thread")


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
