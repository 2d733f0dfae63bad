"""`generate_task`: the embedded profile's stand-in of one task, in the normalized schema.

Labels are balanced; the same seed gives the same bytes; dev examples never repeat a train example.
All words come from `xdbert.data.synthetic.words`, the vocabulary the generated corpus is written in.
"""
from __future__ import annotations

import random
from typing import Callable

import pyarrow as pa

from xdbert.data.synthetic.events import Row
from xdbert.data.synthetic.glue import gen_cola, gen_mnli, gen_mrpc, gen_qnli, gen_qqp, gen_rte, gen_sst2, gen_stsb
from xdbert.data.synthetic.readability import gen_read
from xdbert.data.synthetic.swag import gen_swag
from xdbert.data.synthetic.words import OBJECTS, Noun
from xdbert.data.tasks.registry import get_task, to_table
from xdbert.errors import PipelineError

GENERATORS: dict[str, Callable[..., Row]] = {
    "rte": gen_rte, "mrpc": gen_mrpc, "stsb": gen_stsb, "cola": gen_cola, "sst2": gen_sst2,
    "qnli": gen_qnli, "qqp": gen_qqp, "mnli": gen_mnli, "swag": gen_swag, "read": gen_read,
}


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------

def _labels(task: str, n: int, rng: random.Random) -> list:
    """Balanced labels in random order (STS-B: the shared-slot counts 0..5; READ: none)."""
    spec = get_task(task)
    if task == "read":
        return [None] * n
    k = 6 if task == "stsb" else spec.num_labels
    labels = [i % k for i in range(n)]
    rng.shuffle(labels)
    return labels


def _rows(task: str, n: int, rng: random.Random, seen: set, objects: list[Noun], **kw) -> list[Row]:
    gen = GENERATORS[task]
    rows = []
    for y in _labels(task, n, rng):
        for _ in range(200):  # re-draw duplicates (within the split and against train)
            row = gen(rng, y, objects=objects, **kw)
            key = (row[0], row[1], tuple(row[2]) if row[2] else None)
            if key not in seen:
                break
        else:
            raise PipelineError(f"the {task} stand-in drew 200 repeats of its earlier examples in a row after {len(seen)}: "
                                f"its generator has too few distinct examples for `tasks.train_size` and `tasks.dev_size`; "
                                f"lower them")
        seen.add(key)
        rows.append(row)
    return rows


def generate_task(task: str, train_size: int, dev_size: int, seed: int, objects: list[Noun] = OBJECTS) -> dict[str, pa.Table]:
    """The stand-in of `task`: `train` with `train_size` rows and each dev split with `dev_size`, about `objects`."""
    spec = get_task(task)
    for key, value in (("tasks.train_size", train_size), ("tasks.dev_size", dev_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PipelineError(f"`{key}` must be a positive integer; got {value!r}")
    seen: set = set()
    out = {}
    for split in spec.splits:
        rng = random.Random(f"xdbert-task:{seed}:{task}:{split}")
        kw = {"genre": "mismatched" if split == "dev_mismatched" else "matched"} if task == "mnli" else {}
        rows = _rows(task, train_size if split == "train" else dev_size, rng, seen, objects, **kw)
        out[split] = to_table(spec, {
            "idx": list(range(len(rows))),
            "text_a": [r[0] for r in rows],
            "text_b": [r[1] for r in rows],
            "choices": [r[2] for r in rows],
            "label": [r[3] for r in rows],
        })
    return out
