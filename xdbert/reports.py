"""Markdown result tables: the paper's layout, our medians over seeds, their spread and the paper's numbers."""
from __future__ import annotations

import subprocess

from xdbert.aggregate import Cell
from xdbert.tasks.registry import get_task

COLUMN = {"rte": "RTE", "mrpc": "MRPC", "stsb": "STSB", "cola": "CoLA", "sst2": "SST2", "qnli": "QNLI",
          "qqp": "QQP", "mnli": "MNLI", "swag": "SWAG", "read": "READ"}

# The paper's numbers (PAPER.md), shown beside ours in the paper profile.
PAPER_TABLE1 = {
    "CLIP-T": {"rte": 51.62, "mrpc": 76.20, "stsb": 22.07, "cola": 25.41},
    "BERT-b": {"rte": 66.43, "mrpc": 87.38, "stsb": 88.64, "cola": 56.52, "sst2": 92.46, "qnli": 90.92, "qqp": 89.51, "mnli": 84.35, "swag": 81.0},
    "XDBERT-b": {"rte": 69.31, "mrpc": 88.02, "stsb": 89.32, "cola": 57.55, "sst2": 92.78, "qnli": 91.52, "qqp": 89.57, "mnli": 84.75, "swag": 81.35},
}
PAPER_TABLE3 = {
    "MLM+MATCH+CLIPTC (proposed)": {"rte": 69.31, "mrpc": 88.02, "stsb": 89.32, "cola": 56.27},
    "MLM+MATCH": {"rte": 70.04, "mrpc": 86.93, "stsb": 88.8, "cola": 54.62},
    "MLM": {"rte": 68.23, "mrpc": 87.25, "stsb": 89.29, "cola": 54.78},
    "1 cross-attention layer": {"rte": 66.79, "mrpc": 87.66, "stsb": 89.32, "cola": 53.62},
    "2 epochs": {"rte": 69.31, "mrpc": 88.04, "stsb": 89.31, "cola": 55.91},
    "20 epochs": {"rte": 57.4, "mrpc": 87.74},
}
PAPER_TABLE8 = {
    "XBERT-b": {"rte": 69.31, "mrpc": 88.46, "stsb": 89.59, "cola": 59.05, "sst2": 92.89, "qnli": 91.47, "qqp": 89.37, "mnli": 84.62, "swag": 81.34},
}


def scale(task: str, value: float) -> float:
    """Percent for bounded metrics (as the paper prints them); READ's RMSE stays as it is."""
    return value if get_task(task).metric == "rmse" else 100 * value


def fmt(task: str, value: float) -> str:
    return f"{scale(task, value):.3f}" if get_task(task).metric == "rmse" else f"{scale(task, value):.2f}"


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


def metric_legend(tasks: list[str]) -> str:
    parts = []
    for t in tasks:
        spec = get_task(t)
        unit = "" if spec.metric == "rmse" else " x100"
        extra = f", split {spec.dev_splits[0]}" if len(spec.dev_splits) > 1 else ""
        arrow = "higher is better" if spec.higher_is_better else "lower is better"
        parts.append(f"{COLUMN[t]}: {spec.metric}{unit} ({arrow}{extra})")
    return "Columns: " + "; ".join(parts) + ".\n"


def table(rows: dict[str, dict[str, Cell]], tasks: list[str], deltas: dict[str, dict[str, dict]] | None = None,
          paper: dict[str, dict[str, float]] | None = None) -> str:
    """Rows of 'median (min-max)'; under a row with deltas, its difference to the baseline with a 95% CI."""
    out = ["| model | " + " | ".join(COLUMN[t] for t in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for name, cells in rows.items():
        vals = []
        for t in tasks:
            c = cells.get(t)
            if c is None:
                vals.append("-")
            else:
                lo, hi = c.spread
                vals.append(f"{fmt(t, c.median)} <sub>({fmt(t, lo)}–{fmt(t, hi)})</sub>")
        out.append(f"| {name} | " + " | ".join(vals) + " |")
        if deltas and name in deltas:
            ds = []
            for t in tasks:
                d = deltas[name].get(t)
                if d is None:
                    ds.append("-")
                else:
                    star = "*" if d["significant"] else ""
                    ds.append(f"{scale(t, d['delta']):+.2f}{star} <sub>[{scale(t, d['ci_low']):+.2f}, {scale(t, d['ci_high']):+.2f}]</sub>")
            out.append(f"| ↳ Δ vs baseline | " + " | ".join(ds) + " |")
    for name, vals in (paper or {}).items():
        out.append(f"| *paper: {name}* | " + " | ".join(f"*{vals[t]}*" if t in vals else "-" for t in tasks) + " |")
    return "\n".join(out) + "\n"


ADAPT_COLUMNS = (  # metrics/adapt/<variant>.json key, column, format
    ("steps", "steps", "{}"),
    ("valid_mlm_accuracy", "MLM acc.", "{:.3f}"),
    ("valid_mlm_perplexity", "MLM ppl.", "{:.1f}"),
    ("valid_match_accuracy", "MATCH acc.", "{:.3f}"),
    ("valid_match_majority", "MATCH majority", "{:.3f}"),
    ("valid_cliptc_accuracy", "CLIPTC acc.", "{:.3f}"),
)


def adaptation_table(metrics: dict[str, dict]) -> str:
    """What each adaptation variant reached on held-out windows, beside the finetuning it led to."""
    lines = ["| variant | " + " | ".join(c for _, c, _ in ADAPT_COLUMNS) + " |", "|---|" + "---|" * len(ADAPT_COLUMNS)]
    for name, m in metrics.items():
        lines.append(f"| {name} | " + " | ".join(f.format(m[k]) if k in m else "-" for k, _, f in ADAPT_COLUMNS) + " |")
    return ("\n## Adaptation (held-out valid windows, metrics/adapt/<variant>.json)\n\n" + "\n".join(lines) + "\n\n"
            "A dash: the variant does not train that loss. MATCH: each window sees another window's CLIP text with "
            "probability 0.5; *MATCH majority* is the larger class's share of the sampled windows, what a model that "
            "learned nothing scores.\n")


def footnotes(n_boot: int) -> str:
    return (f"\nCells: median over seeds, with (min–max) across seeds. Δ rows: median difference to the baseline "
            f"with a 95% paired bootstrap interval over dev examples ({n_boot} resamples, the same examples for both "
            f"models and every seed); * marks an interval that excludes 0.\n")
