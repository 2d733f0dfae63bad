"""Batches (xdbert.finetuning.compute.data): length-grouped order, dynamic padding, lengths rounded up to 8."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from keyword_tasks import keyword_tables
from xdbert.data.tasks.registry import get_task
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute.heads import EncoderClassifier
from xdbert.finetuning.compute.loop import pad_multiple

pytestmark = pytest.mark.usefixtures("one_thread")


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
