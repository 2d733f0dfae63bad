"""Atomic outputs: everything is written to a temporary path beside its target, then renamed.

A killed stage therefore leaves either the previous complete output or none, never a half file.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `target`; on success it replaces `target` in one rename.

    On any exception the temporary path is removed and `target` is left exactly as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    work = tmp if is_dir else tmp / target.name
    try:
        yield work
        if target.is_dir() and not target.is_symlink():
            # A directory cannot be replaced by rename while it exists: move it aside first so the
            # window without a complete output is a single rename long.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / "x")
            os.replace(work, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(work, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    from xdbert.errors import PipelineError

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"missing file {path}: run the stage that writes it first (`dvc repro`)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PipelineError(f"{path} is not valid JSON ({e}); delete it and rerun `dvc repro`") from e
