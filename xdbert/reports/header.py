"""The header every report starts with: title, profile, models and seeds, the inputs that decided it.

No commit hash: a report's bytes must depend only on its inputs, so that `dvc status` and a file's hash
mean the same on every checkout (dvc.lock records which code and params made it).
"""
from __future__ import annotations


def header(title: str, profile: str, models: str, seeds: str | None = None) -> str:
    """`seeds`: None for a report of no trained runs (Table 6 counts parameters)."""
    lines = [f"# {title}", "", f"- profile: **{profile}**", f"- models: {models}"] + ([f"- seeds: {seeds}"] if seeds else [])
    if profile == "embedded":
        lines += ["", "> **These are NOT the paper's numbers.** The embedded profile uses tiny random-init models and "
                  "generated stand-in tasks so the whole pipeline runs offline in minutes; it checks the machinery, "
                  "not the claim. Switch with `xdbert profile paper` to reproduce the paper."]
    return "\n".join(lines) + "\n"
