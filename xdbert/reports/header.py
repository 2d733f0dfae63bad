"""The header every report starts with: title, profile, models, seeds and the commit it was computed at."""
from __future__ import annotations

import subprocess

# The files that define what the pipeline computes. A change to any other tracked file (dvc.lock and the
# metrics DVC rewrites while `dvc repro` runs, the README) does not make a report's numbers differ from
# what the commit would produce, so it does not mark the stamp.
SOURCES = ("xdbert", "stages", "dvc.yaml", "params.yaml", "pyproject.toml")


def commit() -> str:
    """HEAD's short hash, with "+uncommitted changes" when the code or params differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *SOURCES],
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def header(title: str, profile: str, models: str, seeds: str) -> str:
    lines = [f"# {title}", "", f"- profile: **{profile}**", f"- models: {models}", f"- seeds: {seeds}",
             f"- commit: `{commit()}`"]
    if profile == "embedded":
        lines += ["", "> **These are NOT the paper's numbers.** The embedded profile uses tiny random-init models and "
                  "generated stand-in tasks so the whole pipeline runs offline in minutes; it checks the machinery, "
                  "not the claim. Switch with `xdbert profile paper` to reproduce the paper."]
    return "\n".join(lines) + "\n"
