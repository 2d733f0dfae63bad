"""Token shards: Arrow IPC files of fixed-size window rows, memory-mapped on read, and their manifest.

Layout of `data/shards` (written by `stages/dual_tokenize.py`, in one atomic rename):

    manifest.json                 counts, sizes, tokenizers, hashes (see `build_manifest`)
    train/shard-00000.arrow ...   `shard_windows` rows each (the last one fewer)
    valid/shard-00000.arrow ...

Columns per window (fixed-size lists, so a shard is a few flat arrays that numpy views without a copy):
`bert_ids` (max_len; uint16 when the vocabulary fits, else int32), `bert_len` (int16, real length with
[CLS]/[SEP]), `clip_ids` (n_blocks*77, uint16), `align_start`/`align_end` (max_len, int16; flat CLIP
positions, -1 for none), `doc_index` (int32, the document's row in the corpus split).

`open_shards` checks every shard against the manifest before training starts, so a missing, cut or
corrupt file fails in a second with its name, not in the middle of an epoch.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from xdbert import io
from xdbert.data.tokenization.vocab import check_tokenizer_folder, clip_vocab_hash, vocab_hash
from xdbert.errors import PipelineError

FORMAT = "xdbert-shards/1"
REBUILD = "rerun `dvc repro dual_tokenize` to rebuild data/shards"
# Column dtypes; bert_ids is uint16 or int32 depending on the vocabulary size (`bert_dtype`).
DTYPES = {"bert_len": np.int16, "clip_ids": np.uint16, "align_start": np.int16, "align_end": np.int16,
          "doc_index": np.int32}
COLUMNS = ("bert_ids", "bert_len", "clip_ids", "align_start", "align_end", "doc_index")


def column_widths(max_len: int, n_blocks: int) -> dict[str, int | None]:
    """Values per row of each column (None: a plain column of one value per row)."""
    return {"bert_ids": max_len, "bert_len": None, "clip_ids": n_blocks * 77, "align_start": max_len,
            "align_end": max_len, "doc_index": None}


def bert_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in it, else int32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def schema(max_len: int, n_blocks: int, bert_vocab_size: int) -> pa.Schema:
    dtypes = {**DTYPES, "bert_ids": bert_dtype(bert_vocab_size)}
    fields = []
    for name, width in column_widths(max_len, n_blocks).items():
        t = pa.from_numpy_dtype(dtypes[name])
        fields.append(pa.field(name, pa.list_(t, width) if width else t, nullable=False))
    return pa.schema(fields)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Buffers window rows and writes `<root>/<split>/shard-NNNNN.arrow` files of `shard_windows` rows."""

    def __init__(self, root: str | Path, split: str, shard_windows: int, max_len: int, n_blocks: int,
                 bert_vocab_size: int):
        self.root, self.split, self.shard_windows = Path(root), split, shard_windows
        self.schema = schema(max_len, n_blocks, bert_vocab_size)
        self.widths = column_widths(max_len, n_blocks)
        (self.root / split).mkdir(parents=True, exist_ok=True)
        self.pending: list[dict[str, np.ndarray]] = []
        self.pending_rows = 0
        self.records: list[dict[str, Any]] = []

    def add(self, rows: dict[str, np.ndarray]) -> None:
        """Queue rows (a dict of the six columns); full shards are written at once."""
        n = len(rows["bert_len"])
        if n == 0:
            return
        self.pending.append(rows)
        self.pending_rows += n
        while self.pending_rows >= self.shard_windows:
            self._flush(self.shard_windows)

    def close(self) -> list[dict[str, Any]]:
        """Write what is left; returns one record per shard: file (relative), rows, bytes, sha256."""
        if self.pending_rows:
            self._flush(self.pending_rows)
        return self.records

    def _flush(self, n: int) -> None:
        merged = {k: np.concatenate([p[k] for p in self.pending]) for k in COLUMNS}
        head = {k: v[:n] for k, v in merged.items()}
        rest = {k: v[n:] for k, v in merged.items()}
        self.pending = [rest] if len(rest["bert_len"]) else []
        self.pending_rows = len(rest["bert_len"])
        rel = f"{self.split}/shard-{len(self.records):05d}.arrow"
        path = self.root / rel
        arrays = []
        for f in self.schema:
            values = np.ascontiguousarray(head[f.name], dtype=(f.type.value_type if self.widths[f.name] else f.type).to_pandas_dtype())
            if self.widths[f.name]:
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), self.widths[f.name]))
            else:
                arrays.append(pa.array(values))
        batch = pa.record_batch(arrays, schema=self.schema)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
            writer.write_batch(batch)  # one uncompressed batch per file: readers map it without a copy
        self.records.append({"file": rel, "rows": n, "bytes": path.stat().st_size, "sha256": sha256_file(path)})


def content_hash(splits: dict[str, dict]) -> str:
    """One hash over every shard's sha256, in split and shard order."""
    h = hashlib.sha256()
    for split in sorted(splits):
        for rec in splits[split]["shards"]:
            h.update(f"{rec['file']}:{rec['sha256']}\n".encode())
    return h.hexdigest()


def build_manifest(*, max_len: int, n_blocks: int, bert: dict, clip: dict, splits: dict[str, dict],
                   extra: dict | None = None) -> dict:
    """The manifest: layout, tokenizers, per-split counts and shard records, and a content hash.

    `bert`: name, path, vocab_size, vocab_sha256, special ids; `clip`: model, vocab_size, vocab_sha256,
    sot_id, eot_id; `splits[split]`: windows, shards, overflow_windows, overflow_share and other counts.
    """
    vocab = int(bert["vocab_size"])
    return {
        "format": FORMAT,
        "max_len": max_len,
        "n_blocks": n_blocks,
        "clip_context": 77,
        "columns": {name: {"dtype": str(np.dtype(DTYPES.get(name, bert_dtype(vocab)))), "width": w}
                    for name, w in column_widths(max_len, n_blocks).items()},
        "bert_tokenizer": bert,
        "clip_tokenizer": clip,
        "splits": splits,
        "content_sha256": content_hash(splits),
        **(extra or {}),
    }


def read_manifest(shard_dir: str | Path) -> dict:
    """`<shard_dir>/manifest.json`, checked for the fields readers rely on."""
    path = Path(shard_dir) / "manifest.json"
    if not path.is_file():
        raise PipelineError(f"missing {path}: {REBUILD}")
    manifest = io.read_json(path)
    missing = [k for k in ("format", "max_len", "n_blocks", "splits", "bert_tokenizer", "clip_tokenizer") if k not in manifest]
    if missing or manifest.get("format") != FORMAT:
        raise PipelineError(f"{path} is not a {FORMAT} manifest (missing {missing or 'the format tag'}): {REBUILD}")
    return manifest


def check_matches(manifest: dict, tokenizer_dir: str | Path, clip_name: str) -> None:
    """Fail unless the shards were made with the tokenizer in `tokenizer_dir` and CLIP `clip_name`'s BPE."""
    from transformers import AutoTokenizer

    from xdbert.clip import clip_tokenizer

    check_tokenizer_folder(tokenizer_dir)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if vocab_hash(tok.get_vocab()) != manifest["bert_tokenizer"]["vocab_sha256"]:
        raise PipelineError(f"the shards were tokenized with another vocabulary than {tokenizer_dir}: {REBUILD}")
    if clip_vocab_hash(clip_tokenizer(clip_name)) != manifest["clip_tokenizer"]["vocab_sha256"]:
        raise PipelineError(f"the shards' CLIP tokens do not come from `model.clip: {clip_name}`'s tokenizer: {REBUILD}")


class ShardDataset:
    """The windows of one split: `len(ds)`, `ds[i]` (a dict of row arrays), `ds[a:b]` / `ds[index_array]`
    (a dict of stacked arrays). Reads memory-mapped shards without copying; a gather copies only the
    rows asked for. Every dict also holds `bert_mask` (uint8, 1 on the bert_len real positions)."""

    def __init__(self, shard_dir: Path, split: str, manifest: dict, shards: list[dict[str, np.ndarray]]):
        self.shard_dir, self.split, self.manifest = shard_dir, split, manifest
        self._shards = shards
        sizes = [len(s["bert_len"]) for s in shards]
        self._ends = np.cumsum(sizes, dtype=np.int64)
        self._starts = self._ends - np.asarray(sizes, dtype=np.int64)
        self.max_len = manifest["max_len"]
        self.n_blocks = manifest["n_blocks"]

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __repr__(self) -> str:
        return f"ShardDataset({self.split!r}, {len(self)} windows in {len(self._shards)} shards)"

    def column(self, name: str) -> np.ndarray:
        """One column over the whole split (a copy when there is more than one shard)."""
        parts = [s[name] for s in self._shards]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __getitem__(self, index) -> dict[str, np.ndarray]:
        if isinstance(index, (int, np.integer)):
            i = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"window {index} out of range for {len(self)} windows")
            k = int(np.searchsorted(self._ends, i, side="right"))
            rows = {name: col[i - self._starts[k]] for name, col in self._shards[k].items()}
            return self._with_mask(rows)
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self)))
        idx = np.asarray(index)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"window index out of range for {len(self)} windows")
        which = np.searchsorted(self._ends, idx, side="right")
        out = {name: np.empty((len(idx), *col.shape[1:]), dtype=col.dtype) for name, col in self._shards[0].items()}
        for k in np.unique(which):
            sel = which == k
            local = idx[sel] - self._starts[k]
            for name, col in self._shards[k].items():
                out[name][sel] = col[local]
        return self._with_mask(out)

    def _with_mask(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lengths = np.asarray(rows["bert_len"])
        rows["bert_mask"] = (np.arange(self.max_len) < lengths[..., None]).astype(np.uint8)
        return rows


def _shard_problem(path: Path, problem: str) -> PipelineError:
    return PipelineError(f"shard {path} {problem}: {REBUILD}")


def open_shards(shard_dir: str | Path, split: str, verify: bool = False) -> ShardDataset:
    """The windows of `split`, after checking every shard against the manifest.

    Checks: the manifest, that each shard exists, has the recorded byte size, opens as Arrow IPC with
    the expected columns and widths and has the recorded row count; with `verify=True` also its sha256.
    Any failure is a PipelineError naming the file and saying to rerun `dvc repro dual_tokenize`.
    """
    shard_dir = Path(shard_dir)
    manifest = read_manifest(shard_dir)
    if split not in manifest["splits"]:
        raise PipelineError(f"{shard_dir}/manifest.json has no split {split!r}; it has {sorted(manifest['splits'])}: {REBUILD}")
    expected = schema(manifest["max_len"], manifest["n_blocks"], manifest["bert_tokenizer"]["vocab_size"])
    widths = column_widths(manifest["max_len"], manifest["n_blocks"])
    shards = []
    for rec in manifest["splits"][split]["shards"]:
        path = shard_dir / rec["file"]
        if not path.is_file():
            raise _shard_problem(path, "is missing")
        size = path.stat().st_size
        if size != rec["bytes"]:
            raise _shard_problem(path, f"has {size} bytes, the manifest records {rec['bytes']} (cut short or replaced)")
        if verify and sha256_file(path) != rec["sha256"]:
            raise _shard_problem(path, "does not match its sha256 in the manifest (corrupt)")
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
            raise _shard_problem(path, f"is not a readable Arrow file ({e})") from e
        if not table.schema.equals(expected):
            raise _shard_problem(path, f"has columns {table.schema} instead of {expected}")
        if table.num_rows != rec["rows"]:
            raise _shard_problem(path, f"has {table.num_rows} rows, the manifest records {rec['rows']}")
        columns = {}
        for name in COLUMNS:
            col = table.column(name)
            chunk = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
            if widths[name]:
                values = chunk.values.to_numpy(zero_copy_only=True)
                columns[name] = values.reshape(table.num_rows, widths[name])
            else:
                columns[name] = chunk.to_numpy(zero_copy_only=True)
        shards.append(columns)
    if not shards:
        raise PipelineError(f"{shard_dir}/manifest.json lists no shards for {split!r}: {REBUILD}")
    return ShardDataset(shard_dir, split, manifest, shards)
