"""A machine's cores, shared by the grids that run on it at once (`dvc queue start -j 2` runs two
experiments' `finetune` stages side by side).

Each core is a slot: a lock file in a folder every grid of the repository sees (beside the run cache), one
folder per machine, since a run cache on a shared filesystem serves several. A grid that starts a local
Ray instance takes every free slot, sizes the instance to them and holds them until it ends; the kernel
drops a process's locks when it exits, so a killed grid frees its cores. A grid that finds none free
still runs, on one worker, beside the others.
"""
from __future__ import annotations

import fcntl
import os
import platform
from pathlib import Path
from typing import IO


def machine_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def slots_folder(run_cache: str | Path) -> Path:
    """This machine's slots beside `run_cache`."""
    return Path(run_cache) / ".cores" / platform.node()


def claim(folder: Path, cores: int) -> list[IO]:
    """Lock every free slot of `cores` in `folder`; the open lock files, which hold them until closed
    (`release`) or until this process ends. Empty when another grid holds every slot."""
    folder.mkdir(parents=True, exist_ok=True)
    held = []
    for i in range(cores):
        f = open(folder / f"{i}.lock", "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        held.append(f)
    return held


def release(held: list[IO]) -> None:
    for f in held:
        f.close()  # closing the file drops its lock
    held.clear()
