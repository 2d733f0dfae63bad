"""Token shards: write/read round trip, the manifest, and clear errors for missing or damaged shards."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from xdbert.data import shards as S
from xdbert.errors import PipelineError

MAX_LEN, N_BLOCKS = 12, 2


def make_rows(n: int, seed: int = 0, vocab: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dtype = S.bert_dtype(vocab)
    return {
        "bert_ids": rng.integers(0, vocab, (n, MAX_LEN)).astype(dtype),
        "bert_len": rng.integers(3, MAX_LEN + 1, n).astype(np.int16),
        "clip_ids": rng.integers(0, 49408, (n, N_BLOCKS * 77)).astype(np.uint16),
        "align_start": rng.integers(-1, 154, (n, MAX_LEN)).astype(np.int16),
        "align_end": rng.integers(-1, 155, (n, MAX_LEN)).astype(np.int16),
        "doc_index": np.arange(n, dtype=np.int32) * 3,
    }


def write_set(root, rows_by_split: dict[str, dict], shard_windows: int = 3, vocab: int = 1000) -> dict:
    splits = {}
    for split, rows in rows_by_split.items():
        w = S.ShardWriter(root, split, shard_windows, MAX_LEN, N_BLOCKS, vocab)
        n = len(rows["bert_len"])
        for a in range(0, n, 2):  # in pieces that do not line up with the shards
            w.add({k: v[a:a + 2] for k, v in rows.items()})
        splits[split] = {"windows": n, "shards": w.close(), "overflow_windows": 0, "overflow_share": 0.0}
    bert = {"name": "random:bert", "path": "models/tokenizer", "vocab_size": vocab, "vocab_sha256": "0" * 64}
    clip = {"model": "xdbert-tiny", "vocab_size": 49408, "vocab_sha256": "1" * 64, "sot_id": 49406, "eot_id": 49407}
    manifest = S.build_manifest(max_len=MAX_LEN, n_blocks=N_BLOCKS, bert=bert, clip=clip, splits=splits)
    (root / "manifest.json").write_text(json.dumps(manifest))
    return manifest


@pytest.fixture()
def shard_set(tmp_path):
    rows = {"train": make_rows(8), "valid": make_rows(2, seed=1)}
    manifest = write_set(tmp_path, rows)
    return tmp_path, rows, manifest


def test_round_trip_and_indexing(shard_set):
    root, rows, manifest = shard_set
    assert [r["file"] for r in manifest["splits"]["train"]["shards"]] == [
        "train/shard-00000.arrow", "train/shard-00001.arrow", "train/shard-00002.arrow"]
    assert [r["rows"] for r in manifest["splits"]["train"]["shards"]] == [3, 3, 2]
    ds = S.open_shards(root, "train", verify=True)
    src = rows["train"]
    assert len(ds) == 8
    one = ds[4]
    for k, v in src.items():
        assert np.array_equal(one[k], v[4]) and one[k].dtype == v.dtype
    assert np.array_equal(ds[-1]["doc_index"], src["doc_index"][-1])
    for index in (slice(2, 7), np.array([7, 0, 3, 3]), slice(None, None, 3), np.arange(8) % 2 == 0):
        got = ds[index]
        for k, v in src.items():
            assert np.array_equal(got[k], v[index]), (k, index)
    assert np.array_equal(ds[np.array([1, 6])]["bert_mask"], (np.arange(MAX_LEN) < src["bert_len"][[1, 6], None]).astype(np.uint8))
    assert np.array_equal(ds.column("clip_ids"), src["clip_ids"])
    with pytest.raises(IndexError):
        ds[8]
    assert len(S.open_shards(root, "valid")) == 2


def test_shards_are_memory_mapped_arrow_with_fixed_size_lists(shard_set):
    root, _, _ = shard_set
    table = pa.ipc.open_file(pa.memory_map(str(root / "train" / "shard-00000.arrow"))).read_all()
    types = {f.name: f.type for f in table.schema}
    assert types["bert_ids"] == pa.list_(pa.uint16(), MAX_LEN) and types["clip_ids"] == pa.list_(pa.uint16(), 154)
    assert types["align_start"] == pa.list_(pa.int16(), MAX_LEN) and types["bert_len"] == pa.int16()
    assert types["doc_index"] == pa.int32()
    ds = S.open_shards(root, "train")
    assert not ds._shards[0]["bert_ids"].flags.writeable  # a read-only view of the mapped file


def test_large_vocabularies_use_int32(tmp_path):
    rows = {"train": make_rows(4, vocab=70000)}
    write_set(tmp_path, rows, vocab=70000)
    ds = S.open_shards(tmp_path, "train")
    assert ds[0]["bert_ids"].dtype == np.int32 and np.array_equal(ds[:]["bert_ids"], rows["train"]["bert_ids"])


def test_manifest_contents(shard_set):
    root, _, manifest = shard_set
    m = S.read_manifest(root)
    assert m == manifest
    assert m["format"] == S.FORMAT and m["max_len"] == MAX_LEN and m["n_blocks"] == N_BLOCKS
    assert m["columns"]["bert_ids"] == {"dtype": "uint16", "width": MAX_LEN}
    assert m["columns"]["clip_ids"] == {"dtype": "uint16", "width": 154}
    for rec in m["splits"]["train"]["shards"]:
        path = root / rec["file"]
        assert rec["bytes"] == path.stat().st_size and rec["sha256"] == S.sha256_file(path)
    assert m["content_sha256"] == S.content_hash(m["splits"]) and len(m["content_sha256"]) == 64


def expect_problem(root, split: str, name: str, verify: bool = False) -> str:
    with pytest.raises(PipelineError) as e:
        S.open_shards(root, split, verify=verify)
    text = str(e.value)
    assert name in text and "dvc repro dual_tokenize" in text
    return text


def test_missing_shard(shard_set):
    root, _, _ = shard_set
    os.remove(root / "train" / "shard-00001.arrow")
    assert "is missing" in expect_problem(root, "train", "shard-00001.arrow")


def test_truncated_shard(shard_set):
    root, _, _ = shard_set
    path = root / "train" / "shard-00002.arrow"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "cut short" in expect_problem(root, "train", "shard-00002.arrow")


def test_wrong_row_count(shard_set):
    root, _, manifest = shard_set
    manifest["splits"]["train"]["shards"][0]["rows"] = 4
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert "has 3 rows, the manifest records 4" in expect_problem(root, "train", "shard-00000.arrow")


def test_corrupt_shard_of_the_right_size(shard_set):
    root, _, _ = shard_set
    path = root / "train" / "shard-00000.arrow"
    data = bytearray(path.read_bytes())
    data[-10:] = b"garbage!!!"  # the footer and the closing magic bytes
    path.write_bytes(bytes(data))
    assert "not a readable Arrow file" in expect_problem(root, "train", "shard-00000.arrow")


def test_changed_bytes_are_caught_by_the_checksum(shard_set):
    root, _, _ = shard_set
    path = root / "valid" / "shard-00000.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the data buffers: still readable Arrow
    path.write_bytes(bytes(data))
    S.open_shards(root, "valid")  # size and row count still agree
    assert "sha256" in expect_problem(root, "valid", "shard-00000.arrow", verify=True)


def test_missing_manifest_and_unknown_split(shard_set):
    root, _, _ = shard_set
    with pytest.raises(PipelineError, match="no split 'test'"):
        S.open_shards(root, "test")
    (root / "manifest.json").unlink()
    with pytest.raises(PipelineError, match="missing .*manifest.json.*dvc repro dual_tokenize"):
        S.read_manifest(root)
