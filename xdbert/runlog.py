"""The run log: what changes from run to run without changing a result (wall-clock times, the machine).

It is kept out of every output DVC hashes, so two runs of the same inputs write the same bytes and `dvc
status` means the same on every machine. Each stage appends one JSON line to logs/<stage>.jsonl, which git
and DVC ignore.
"""
from __future__ import annotations

import json
import platform
import re
import time
from typing import Any

from xdbert import io, paths

TIMING = re.compile(r"^(seconds|.*_seconds|mb_per_s)$")


def split_timings(metrics: Any) -> tuple[Any, Any]:
    """(metrics without wall-clock timings, the timings alone), at any depth of nested dicts."""
    if not isinstance(metrics, dict):
        return metrics, None
    kept, timings = {}, {}
    for key, value in metrics.items():
        if TIMING.match(str(key)):
            timings[key] = value
            continue
        kept[key], inner = split_timings(value)
        if inner:
            timings[key] = inner
    return kept, timings


def record(stage: str, entry: dict) -> None:
    """Append `entry` with the time and the machine to logs/<stage>.jsonl."""
    from xdbert.numerics import cpu_description

    line = {"stage": stage, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
            "cpu": cpu_description(), **entry}
    paths.RUN_LOG.mkdir(parents=True, exist_ok=True)
    with open(paths.RUN_LOG / f"{stage.replace('@', '_')}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def write_metrics(path, metrics: dict, stage: str) -> dict:
    """Write a stage's metrics file without its timings, which go to the run log; returns what was written."""
    kept, timings = split_timings(metrics)
    io.write_json(path, kept)
    record(stage, {"timings": timings or {}})
    return kept
