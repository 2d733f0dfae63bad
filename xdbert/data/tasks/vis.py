"""The mechanism study's probe task `vis` as a task directory: its splits and the dev rows' kinds.

`world.vis_examples` draws the sentences; here they become the normalized schema (`registry.VIS_SPEC`) and
the sidecar table that says of each dev row which kind it is (F+, F0, T=, T!=) and which object it names.
"""
from __future__ import annotations

import pyarrow as pa

from xdbert.data.mechanism import MechanismSettings
from xdbert.data.synthetic.world import vis_examples
from xdbert.data.tasks.registry import VIS_KINDS, VIS_SPEC, to_table

DEV_KINDS = "dev_kinds.parquet"  # beside vis's splits in data/tasks/vis/
KINDS_SCHEMA = pa.schema([("idx", pa.int64()), ("kind", pa.string()), ("object", pa.string())])


def vis_task(mechanism: MechanismSettings, seed: int) -> tuple[dict[str, pa.Table], pa.Table]:
    """({"train", "dev"}: tables in the normalized schema, the dev rows' kinds) for the facts of `mechanism`,
    the sizes of `mechanism.vis` and the examples' `seed` (`tasks.seed`)."""
    sizes = mechanism.vis
    rows, kinds = vis_examples(mechanism.facts(), sizes["train"], sizes["f_plus"], sizes["f_zero"], sizes["t"], seed)
    tables = {split: to_table(VIS_SPEC, {"idx": list(range(len(r))), "text_a": [x[0] for x in r],
                                         "text_b": [x[1] for x in r], "choices": [x[2] for x in r],
                                         "label": [x[3] for x in r]})
              for split, r in rows.items()}
    if any(k["kind"] not in VIS_KINDS for k in kinds):  # world.py and the report must agree on the kinds
        raise ValueError(f"vis: dev kinds {sorted({k['kind'] for k in kinds})} are not {', '.join(VIS_KINDS)}")
    sidecar = pa.Table.from_pydict({"idx": list(range(len(kinds))), "kind": [k["kind"] for k in kinds],
                                    "object": [k["object"] for k in kinds]}, schema=KINDS_SCHEMA)
    return tables, sidecar
