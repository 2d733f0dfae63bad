"""Atomic outputs: everything is written to a temporary path beside its target, then renamed.

A killed stage therefore leaves either the previous complete output or none, never a half file.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, is_dir: bool = False, shared: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `target`; on success it replaces `target` in one rename.

    On any exception the temporary path is removed and `target` is left exactly as it was. `shared`: a
    file other processes may write at the same time (the run cache, which experiments run at once
    share); each write has a temporary path of its own and the last rename wins, whole.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # What a killed write of this target left behind (its rename never came): only one stage writes a
    # target at a time (DVC locks the repository), so nothing else can be using it. A shared target's
    # may be another process's write in flight: a killed write leaves its hidden folder.
    for suffix in () if shared else ("tmp", "old"):
        for stale in target.parent.glob(f".{glob.escape(target.name)}.*.{suffix}"):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    work = tmp if is_dir else tmp / target.name
    try:
        yield work
        if is_dir:
            # mkdtemp makes the folder private (0700); an output must be readable as any folder the
            # user makes is (0755 under the usual umask), e.g. by a cluster group sharing the results.
            os.chmod(work, 0o777 & ~_umask())
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


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_parquet(table, path: str | os.PathLike) -> None:
    """Write an Arrow table with a CRC per page, so `read_parquet` tells a flipped byte from the data."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, write_page_checksum=True)


def read_parquet(path: str | os.PathLike, remedy: str):
    """A parquet file as an Arrow table, its page checksums verified; a missing or damaged file is a
    PipelineError naming it and `remedy`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xdbert.errors import PipelineError

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"missing file {path}: {remedy}")
    try:
        return pq.read_table(path, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as e:  # pyarrow raises several types for a damaged file
        raise PipelineError(f"{path} is damaged ({' '.join(str(e).split())[:200]}): {remedy}") from e


def read_json(path: str | os.PathLike) -> dict:
    """A JSON file holding one object: every configuration, manifest and metrics file the stages write."""
    from xdbert.errors import PipelineError

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"missing file {path}: run the stage that writes it first (`dvc repro`)")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not even UTF-8 text
        raise PipelineError(f"{path} is not valid JSON ({e}); delete it and rerun `dvc repro`") from e
    if not isinstance(value, dict):
        raise PipelineError(f"{path} holds a JSON {type(value).__name__}, not the object its stage writes; delete it "
                            "and rerun `dvc repro`")
    return value


def check_safetensors(path: str | os.PathLike) -> None:
    """A safetensors file reads: its header covers the whole file, so a cut-short or damaged one fails
    here, in a second, instead of as a traceback from the loader."""
    from safetensors import safe_open

    from xdbert.errors import PipelineError

    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError, or an OSError
        raise PipelineError(f"model file {path} is missing or damaged ({' '.join(str(e).split())[:160]}): "
                            f"rerun the stage that writes {Path(path).parent} (`dvc repro`)") from e
