"""`dvc` and `git` commands as the end-to-end tests run them (`from dvc_cli import sh, ran`)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def sh(*cmd: str, cwd: Path, log: Path | None = None) -> str:
    """Run `cmd`, which must succeed; its output, or with `log` its output written to that file instead of
    pipes: a daemon the command forks inherits them, and a pipe would keep this call waiting until it exits."""
    if log is None:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    else:
        with open(log, "w") as f:
            r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, text=True)
        r.stdout, r.stderr = log.read_text(), ""
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def ran(log: str) -> set[str]:
    """The stages a `dvc repro` log says it ran."""
    return {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage '")}
