"""The result tables of the paper (Tables 1, 3 and 8): our medians over seeds, their spread, the paired
bootstrap against the baseline and the paper's numbers, as markdown; and the same numbers as data.

`render(settings, finetune_dir, adapt_metrics_dir)` reads every finetune run's dev predictions
(<finetune_dir>/<task>/<run>/predictions.parquet) and, for Table 3, each variant's adaptation metrics
(<adapt_metrics_dir>/<variant>.json).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from xdbert import io
from xdbert.data.tasks.registry import TaskSpec
from xdbert.finetuning.runs import CLIP_MODEL, run_name
from xdbert.reports.aggregate import Cell, Replicates, bootstrap_replicates, cell, compare, read_predictions
from xdbert.reports.header import header
from xdbert.reports.settings import AggregateSettings

COLUMN = {"rte": "RTE", "mrpc": "MRPC", "stsb": "STSB", "cola": "CoLA", "sst2": "SST2", "qnli": "QNLI",
          "qqp": "QQP", "mnli": "MNLI", "swag": "SWAG", "read": "READ"}
BASELINE = "baseline"   # the adapted encoder every Δ row is compared with (MLM only, no CLIP)

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


# ----------------------------------------------------------------------------------------------------
# Markdown pieces
# ----------------------------------------------------------------------------------------------------

def scale(task: TaskSpec, value: float) -> float:
    """Percent for bounded metrics (as the paper prints them); READ's RMSE stays as it is."""
    return value if task.metric == "rmse" else 100 * value


def fmt(task: TaskSpec, value: float) -> str:
    return f"{scale(task, value):.3f}" if task.metric == "rmse" else f"{scale(task, value):.2f}"


def metric_legend(tasks: list[TaskSpec]) -> str:
    parts = []
    for spec in tasks:
        unit = "" if spec.metric == "rmse" else " x100"
        extra = f", split {spec.dev_splits[0]}" if len(spec.dev_splits) > 1 else ""
        arrow = "higher is better" if spec.higher_is_better else "lower is better"
        parts.append(f"{COLUMN[spec.name]}: {spec.metric}{unit} ({arrow}{extra})")
    return "Columns: " + "; ".join(parts) + ".\n"


def table(rows: dict[str, dict[TaskSpec, Cell]], tasks: list[TaskSpec], deltas: dict[str, dict[TaskSpec, dict]] | None = None,
          paper: dict[str, dict[str, float]] | None = None) -> str:
    """Rows of 'median (min-max)'; under a row with deltas, its difference to the baseline with a 95% CI."""
    out = ["| model | " + " | ".join(COLUMN[t.name] for t in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
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
            out.append("| ↳ Δ vs baseline | " + " | ".join(ds) + " |")
    for name, vals in (paper or {}).items():
        out.append(f"| *paper: {name}* | " + " | ".join(f"*{vals[t.name]}*" if t.name in vals else "-" for t in tasks) + " |")
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


def models_line(s: AggregateSettings) -> str:
    """The header's `models:` line: which encoder and CLIP tower, and where their weights come from."""
    encoder_origin = " (pretrained on the corpus by `pretrain_encoder`)" if s.encoder.startswith("random:") else ""
    clip_origin = s.clip_pretrained or (f"random init + {s.clip_steps} steps of next-token prediction on the corpus"
                                        if s.clip_steps else "random init")
    return f"encoder `{s.encoder}`{encoder_origin}, CLIP `{s.clip}` ({clip_origin})"


def seeds_line(s: AggregateSettings) -> str:
    return f"{len(s.seeds)} per task ({', '.join(map(str, s.seeds))}), {len(s.rte_seeds)} for RTE"


def table3_seeds(s: AggregateSettings) -> str:
    """Table 3's seeds line: its protocol's seeds where it has its own."""
    seeds = s.study.protocol.seeds
    return f"{len(seeds)} per task ({', '.join(map(str, seeds))}), RTE included" if seeds else seeds_line(s)


def protocol_note(s: AggregateSettings) -> str:
    """How Table 3's runs were finetuned, and the paper's row this pipeline cannot reproduce."""
    p = s.study.protocol
    if p.own:
        lr = f"lr {p.lr:g} for every task" if p.lr is not None else "Table 1's rate of each task"
        seeds = f"seeds {', '.join(map(str, p.seeds))} on every task" if p.seeds else "Table 1's seeds of each task"
        how = (f"Table 3's own protocol, as the paper ran its ablations: {lr}, {seeds}. The baseline and Table 1's "
               f"models are rerun under it (runs `table3_<name>`), so every row of this table shares it.")
    else:
        how = "Table 1's runs: its rate and seeds of each task (`finetune.ablation_lr` and `ablation_seeds` are null)."
    return (f"\nFinetuning: {how}\n\nNot reproduced: the paper's row *wiki (14G), same steps* adapts on a 14 GB "
            "Wikipedia dump for the steps of the wiki103 run; this pipeline's corpus stage reads wiki103 alone, so no "
            "run stands for it.\n")


# ----------------------------------------------------------------------------------------------------
# Tables 1, 3 and 8
# ----------------------------------------------------------------------------------------------------

class _Tables:
    """The three tables of one aggregate: every run's predictions read once, every Δ row's replicates drawn once."""

    def __init__(self, s: AggregateSettings, finetune_dir: Path):
        self.s, self.finetune_dir = s, Path(finetune_dir)
        self.preds: dict[tuple[str, TaskSpec], pd.DataFrame] = {}
        self.replicates: dict[tuple[str, TaskSpec], Replicates] = {}

    def load(self, run: str, task: TaskSpec) -> pd.DataFrame:
        if (run, task) not in self.preds:
            self.preds[run, task] = read_predictions(self.finetune_dir / task.name / run / "predictions.parquet")
        return self.preds[run, task]

    def resample(self, needed: list[tuple[dict[str, str], list[TaskSpec], str]]) -> None:
        """Each (run, task) that a Δ row needs is resampled once: the baseline and xdbert are in all three tables.
        `needed`: (runs, tasks, the baseline run they are compared with)."""
        pairs = {(r, t.name): (r, t) for runs, ts, base in needed for r in [base, *runs.values()] for t in ts}
        for key in sorted(pairs):
            r, t = pairs[key]
            self.replicates[r, t] = bootstrap_replicates(self.load(r, t), t, self.s.n_boot, self.s.seed)

    def deltas(self, runs: dict[str, str], tasks: list[TaskSpec], baseline: str) -> dict[str, dict[TaskSpec, dict]]:
        return {label: {t: compare(self.replicates[r, t], self.replicates[baseline, t]) for t in tasks}
                for label, r in runs.items() if r != baseline}

    def render(self, title: str, runs: dict[str, str], tasks: list[TaskSpec], row_tasks: dict[str, list[TaskSpec]],
               compared: dict[str, str], paper_rows: dict, extra: str = "", baseline: str = BASELINE,
               seeds: str = "") -> tuple[str, dict]:
        """(markdown, results) of one table: a row per run label, its cells on `row_tasks[label]` (default `tasks`),
        Δ rows for the labels in `compared` against the run `baseline`; `seeds`: the header's seeds line
        (default Table 1's)."""
        s = self.s
        body = {label: {t: cell(self.load(runs[label], t), t) for t in row_tasks.get(label, tasks)} for label in runs}
        d = self.deltas(compared, tasks, baseline)
        text = (header(title, s.profile, models_line(s), seeds or seeds_line(s)) + "\n" + metric_legend(tasks) + "\n"
                + table(body, tasks, d, paper_rows if s.profile == "paper" else None) + footnotes(s.n_boot) + extra
                + "\n## Every metric (median over seeds)\n\n"
                + "\n".join(f"- {label} / {t.name}: " + ", ".join(f"{k} {v:.4f}" for k, v in c.all_metrics.items())
                            for label, cs in body.items() for t, c in cs.items())
                + self.other_splits(runs, row_tasks, tasks) + "\n")
        results = {label: {t.name: {"median": c.median, "per_seed": c.per_seed, "metrics": c.all_metrics,
                                    **({"vs_baseline": d[label][t]} if label in d and t in d[label] else {})}
                           for t, c in cs.items()} for label, cs in body.items()}
        return text, results

    def other_splits(self, runs: dict[str, str], row_tasks: dict[str, list[TaskSpec]], tasks: list[TaskSpec]) -> str:
        lines = []
        for label, r in runs.items():
            for t in row_tasks.get(label, tasks):
                for split in t.dev_splits[1:]:
                    c = cell(self.load(r, t), t, split)
                    lines.append(f"- {label} / {t.name} {split}: {c.all_metrics} (median over seeds)")
        return ("\n\n## Other dev splits\n\n" + "\n".join(lines)) if lines else ""


def render(s: AggregateSettings, finetune_dir: Path, adapt_metrics_dir: Path) -> tuple[dict[str, str], dict]:
    """({report name: markdown} of table1, table3 and table8, {report name: {row: {task: numbers}}})."""
    study = s.study
    given = {t.name: t for t in s.tasks}
    every = [given[name] for name in COLUMN if name in given]  # the columns in the paper's order
    ablation_tasks = [t for t in every if t.name in study.ablation_tasks]
    encoders = {BASELINE: BASELINE, **{m: run_name("encoder", m) for m in study.models if m != BASELINE}}
    variants = study.table3_runs()
    table3_baseline = variants.pop(BASELINE, BASELINE)
    full = {f"full {m}": run_name("full", m) for m in study.full_models}

    tables = _Tables(s, finetune_dir)
    tables.resample([(encoders, every, BASELINE), (variants, ablation_tasks, table3_baseline), (full, every, BASELINE)])
    clip_row = {"CLIP-T": [t for t in every if t.name in study.clip_tasks]}
    adapted = {v: io.read_json(Path(adapt_metrics_dir) / f"{v}.json") for v in [BASELINE, *variants]}
    rendered = {
        "table1": tables.render("Table 1: main results (dev sets)", {"CLIP-T": run_name("clip", CLIP_MODEL), **encoders},
                                every, clip_row, encoders, PAPER_TABLE1),
        "table3": tables.render("Table 3: adaptation ablations", {BASELINE: table3_baseline, **variants}, ablation_tasks, {},
                                variants, PAPER_TABLE3, protocol_note(s) + adaptation_table(adapted), table3_baseline,
                                table3_seeds(s)),
        "table8": tables.render("Table 8: finetuning the full cross-modal model", {BASELINE: BASELINE, **encoders, **full},
                                every, {}, {**encoders, **full}, PAPER_TABLE8),
    }
    return {name: text for name, (text, _) in rendered.items()}, {name: r for name, (_, r) in rendered.items()}


def results_csv(results: dict) -> str:
    """One row per (table, model, task): its median over seeds."""
    flat = [{"table": tb, "model": m, "task": t, "median": v["median"]} for tb, r in results.items()
            for m, ts in r.items() for t, v in ts.items()]
    return pd.DataFrame(flat).to_csv(index=False)


def tables_metrics(results: dict) -> dict:
    """What `dvc exp show` / `dvc metrics diff` compare: the Table 1 and Table 3 medians."""
    return {tb: {m: {t: round(v["median"], 6) for t, v in ts.items()} for m, ts in results[tb].items()}
            for tb in ("table1", "table3")}
