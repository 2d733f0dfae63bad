"""Which code a benchmark measured: the commit, and whether the tree had uncommitted changes.

Every result in bench/results/ records `code_version()`. In a git checkout that is `git rev-parse HEAD` and
whether `git status --porcelain` lists anything outside bench/results/ (a benchmark's own results, written
while it runs, do not make the code it measured dirty). The GPU machine gets the tree without `.git`, so
the lease scripts pass the commit in, from this side, in XDBERT_COMMIT and XDBERT_DIRTY; the result then
says so. `python bench/provenance.py` prints those two assignments for the device command:

    XDBERT_COMMIT=... XDBERT_DIRTY=0 bash bench/gpu_adapt.sh
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMIT, DIRTY = "XDBERT_COMMIT", "XDBERT_DIRTY"
RESULTS = "bench/results"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()


@functools.cache
def code_version(root: Path = ROOT) -> dict:
    """{"commit", "dirty", "commit_from"}: from git where `root` is a checkout, else from XDBERT_COMMIT and
    XDBERT_DIRTY (1 or 0) as the lease script passed them; commit and dirty are None where neither says.
    Once per process, so every result a run writes names the same state."""
    if (root / ".git").exists():  # the checkout's own: a folder, or a worktree's file
        changes = git(root, "status", "--porcelain", "--", ".", f":(exclude){RESULTS}")
        return {"commit": git(root, "rev-parse", "HEAD"), "dirty": bool(changes), "commit_from": "git"}
    if os.environ.get(COMMIT):
        dirty = {"1": True, "0": False}.get(os.environ.get(DIRTY, ""))
        return {"commit": os.environ[COMMIT], "dirty": dirty, "commit_from": f"passed in ({COMMIT}, no .git here)"}
    return {"commit": None, "dirty": None, "commit_from": f"unknown: no .git here and no {COMMIT} passed in"}


def describe(version: dict) -> str:
    """One line for a markdown result: `Code: commit 1a2b3c4d5e6f, uncommitted changes (passed in ...).`"""
    if version["commit"] is None:
        return f"Code: {version['commit_from']}."
    state = {True: ", uncommitted changes", False: ", clean", None: ", changes unknown"}[version["dirty"]]
    source = "" if version["commit_from"] == "git" else f" ({version['commit_from']})"
    return f"Code: commit {version['commit'][:12]}{state}{source}."


if __name__ == "__main__":
    v = code_version()
    if v["commit_from"] != "git":
        raise SystemExit(f"not a git checkout: run this where the commit is known ({v['commit_from']})")
    print(f"{COMMIT}={v['commit']} {DIRTY}={int(v['dirty'])}")
