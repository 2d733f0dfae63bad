"""CoDa (Paik et al., EMNLP 2021; hub dataset `corypaik/coda`, Apache-2.0), read from its pinned snapshot into plain data.

The hub repository is script-based (`coda.py`), which the pinned `datasets` refuses to run, so its three data files
are read with `datasets`' `json` builder. Their layout (xdbert.hub_layouts.DATASETS, with sources): rows are object
x template, written by `Dataset.to_json(orient="records", lines=True)` in the authors' repository (nala-cub/coda,
projects/coda/probing/dataset/dataset.py), so the two ClassLabel columns hold their ids:

    class_id, display_name, ngram: text; label: 11 floats, the object's human colour distribution in COLORS' order;
    object_group: 0 Single, 1 Multi, 2 Any; text: the filled template; template_group: 0 clip-imagenet,
    1 text-masked (with a [MASK]); template_idx: the template's index.

Every problem is one `PipelineError` naming the file and its line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from xdbert.errors import PipelineError

SPLITS = ("train", "validation", "test")
# the authors' `COLORS` (projects/coda/probing/_src/constants.py): ViComTe's colours without silver
COLORS = ("black", "blue", "brown", "gray", "green", "orange", "pink", "purple", "red", "white", "yellow")
OBJECT_GROUPS = ("Single", "Multi", "Any")
TEMPLATE_GROUPS = ("clip-imagenet", "text-masked")
TEXT_COLUMNS = ("class_id", "display_name", "ngram", "text")
COLUMNS = (*TEXT_COLUMNS, "label", "object_group", "template_group", "template_idx")


@dataclass(frozen=True)
class CodaRow:
    class_id: str                 # the Open Images id of the object ("/m/0k5j")
    display_name: str             # "Aircraft"
    ngram: str                    # the object's words ("aircraft")
    label: tuple[float, ...]      # the human colour distribution, in COLORS' order
    object_group: str             # one of OBJECT_GROUPS
    text: str                     # the template filled with the object
    template_group: str           # one of TEMPLATE_GROUPS
    template_idx: int


def data_file(folder: str | Path, split: str) -> Path:
    """Where a snapshot of the hub repository keeps `split`'s rows."""
    return Path(folder) / "data" / f"default_{split}.jsonl"


def load_coda(hub_id: str, cache_dir: str | None = None) -> dict[str, tuple[CodaRow, ...]]:
    """Every split of CoDa from the snapshot hub.lock.json pins (xdbert.hub.source), checked."""
    from xdbert.hub import source

    return read_coda(source(hub_id, "dataset"), cache_dir)


def read_coda(folder: str | Path, cache_dir: str | None = None) -> dict[str, tuple[CodaRow, ...]]:
    """Every split of CoDa from a folder in the hub repository's layout, checked."""
    import datasets

    paths = {split: data_file(folder, split) for split in SPLITS}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise PipelineError(f"missing {missing[0]}: a snapshot of CoDa holds data/default_{{{','.join(SPLITS)}}}.jsonl "
                            f"(`xdbert fetch` downloads it)")
    out = {}
    for split, path in paths.items():
        if not path.read_text(encoding="utf-8").strip():  # `datasets` fails on an empty file without a word
            raise PipelineError(f"{path} holds no rows")
        try:
            ds = datasets.load_dataset("json", data_files={split: str(path)}, split=split, cache_dir=cache_dir)
        except Exception as e:  # the json builder's errors wrap the parser's (a cut-short line, a column of mixed types)
            raise PipelineError(f"{path} is not CoDa's JSON lines ({' '.join(str(e).split())[:200]})") from e
        lacking = [c for c in COLUMNS if c not in ds.column_names]
        if lacking:
            raise PipelineError(f"{path} lacks the columns {lacking}; CoDa's rows have {', '.join(COLUMNS)}")
        out[split] = tuple(_row(path, n, row) for n, row in enumerate(ds.select_columns(list(COLUMNS)).to_list(), 1))
    return out


def _row(path: Path, n: int, row: dict) -> CodaRow:
    """Line `n` of `path`, checked."""
    def bad(what: str):
        return PipelineError(f"{path}, line {n}: {what}; got {str(row)[:120]}")

    for column in TEXT_COLUMNS:
        if not isinstance(row[column], str) or not row[column].strip():
            raise bad(f"`{column}` must be non-empty text")
    label = row["label"]
    if (not isinstance(label, list) or len(label) != len(COLORS)
            or any(not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in label)):
        raise bad(f"`label` must be {len(COLORS)} non-negative numbers, one per colour ({', '.join(COLORS)})")
    for column, names in (("object_group", OBJECT_GROUPS), ("template_group", TEMPLATE_GROUPS)):
        if not isinstance(row[column], int) or not 0 <= row[column] < len(names):
            raise bad(f"`{column}` must be a class id: {', '.join(f'{i} {name}' for i, name in enumerate(names))}")
    if not isinstance(row["template_idx"], int) or row["template_idx"] < 0:
        raise bad("`template_idx` must be a non-negative integer")
    return CodaRow(row["class_id"], row["display_name"], row["ngram"], tuple(float(x) for x in label),
                   OBJECT_GROUPS[row["object_group"]], row["text"], TEMPLATE_GROUPS[row["template_group"]],
                   row["template_idx"])
