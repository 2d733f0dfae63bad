"""The result tables of the paper (Tables 1, 3 and 8): our medians over seeds, their spread, the paired
bootstrap against the baseline and the paper's numbers, as markdown; and the same numbers as data.

Tables 1 and 8 have rows for every encoder family: its MLM-only baseline (the family's label, e.g. BERT-b),
its adapted encoder (XDBERT-b) and, in Table 8, its whole cross-modal model (XBERT-b); each Δ row compares a
model with its own family's baseline. Table 3 has the ablations of `adapt.family` alone.

`render(settings, finetune_dir, adapt_metrics_dir)` reads every finetune run's dev predictions
(<finetune_dir>/<task>/<run>/predictions.parquet, <run> as `xdbert.finetuning.control.runs.run_name` names it) and
each family's adaptation metrics (<adapt_metrics_dir>/<family>/<variant>.json): Table 3's variants, and the
MLM head each family's adaptation started from.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from xdbert import io, paths
from xdbert.data.tasks.registry import TaskSpec
from xdbert.errors import PipelineError
from xdbert.finetuning.control.predictions import read_predictions
from xdbert.finetuning.control.runs import CLIP_MODEL, Study, run_name
from xdbert.model.families import Family
from xdbert.params import BASELINE, PROPOSED
from xdbert.random_encoder import RANDOM_PREFIX
from xdbert.reports.aggregate import Cell, Replicates, bootstrap_replicates, cell, compare
from xdbert.reports.header import header
from xdbert.reports.settings import CLIP_ROW, AggregateSettings

COLUMN = {"rte": "RTE", "mrpc": "MRPC", "stsb": "STSB", "cola": "CoLA", "sst2": "SST2", "qnli": "QNLI",
          "qqp": "QQP", "mnli": "MNLI", "swag": "SWAG", "read": "READ"}

# The paper's Table 1, shown in the paper profile under our row of the same name.
PAPER_TABLE1 = {
    "CLIP-T": {"rte": 51.62, "mrpc": 76.20, "stsb": 22.07, "cola": 25.41},
    "BERT-b": {"rte": 66.43, "mrpc": 87.38, "stsb": 88.64, "cola": 56.52, "sst2": 92.46, "qnli": 90.92, "qqp": 89.51, "mnli": 84.35, "swag": 81.0},
    "XDBERT-b": {"rte": 69.31, "mrpc": 88.02, "stsb": 89.32, "cola": 57.55, "sst2": 92.78, "qnli": 91.52, "qqp": 89.57, "mnli": 84.75, "swag": 81.35},
    "ELECTRA-b": {"rte": 78.70, "mrpc": 89.49, "stsb": 90.77, "cola": 66.09, "sst2": 94.5, "qnli": 92.69, "qqp": 90.29, "mnli": 88.23, "swag": 88.60},
    "XDELECTRA-b": {"rte": 80.51, "mrpc": 90.55, "stsb": 91.04, "cola": 66.76, "sst2": 95.20, "qnli": 93.03, "qqp": 90.4, "mnli": 88.75, "swag": 88.73},
    "ELECTRA-l": {"rte": 86.64, "mrpc": 91.53, "stsb": 91.88, "cola": 69.27, "sst2": 96.90, "qnli": 94.78, "qqp": 91.34, "mnli": 90.99, "swag": 92.46, "read": 0.685},
    "XDELECTRA-l": {"rte": 87.73, "mrpc": 92.12, "stsb": 91.97, "cola": 70.98, "sst2": 97.36, "qnli": 94.93, "qqp": 91.29, "mnli": 91.02, "swag": 92.59, "read": 0.635},
}
# Table 3's rows keyed by the variant that reproduces each (the paper profile's names), and the paper's names
PAPER_TABLE3 = {
    PROPOSED: {"rte": 69.31, "mrpc": 88.02, "stsb": 89.32, "cola": 56.27},
    "mlm_match": {"rte": 70.04, "mrpc": 86.93, "stsb": 88.8, "cola": 54.62},
    "mlm": {"rte": 68.23, "mrpc": 87.25, "stsb": 89.29, "cola": 54.78},
    "one_cross": {"rte": 66.79, "mrpc": 87.66, "stsb": 89.32, "cola": 53.62},
    "two_epochs": {"rte": 69.31, "mrpc": 88.04, "stsb": 89.31, "cola": 55.91},
    "twenty_epochs": {"rte": 57.4, "mrpc": 87.74},
}
PAPER_TABLE3_NAMES = {PROPOSED: "MLM+MATCH+CLIPTC (proposed)", "mlm_match": "MLM+MATCH", "mlm": "MLM",
                      "one_cross": "1 cross-attention layer", "two_epochs": "2 epochs", "twenty_epochs": "20 epochs"}
PAPER_TABLE8 = {
    "XBERT-b": {"rte": 69.31, "mrpc": 88.46, "stsb": 89.59, "cola": 59.05, "sst2": 92.89, "qnli": 91.47, "qqp": 89.37, "mnli": 84.62, "swag": 81.34},
    "XELECTRA-b": {"rte": 79.78, "mrpc": 91.06, "stsb": 91.46, "cola": 66.8, "sst2": 95.06, "qnli": 93.04, "qqp": 90.62, "mnli": 88.97, "swag": 88.91},
    "XELECTRA-l": {"rte": 88.45, "mrpc": 92.33, "stsb": 92.04, "cola": 70.51, "sst2": 97.36, "qnli": 94.97, "qqp": 91.4, "mnli": 91.03, "swag": 92.83, "read": 0.565},
}


# ----------------------------------------------------------------------------------------------------
# Markdown pieces
# ----------------------------------------------------------------------------------------------------

def scale(task: TaskSpec, value: float) -> float:
    """Percent for bounded metrics (as the paper prints them); READ's RMSE stays as it is."""
    return value if task.metric == "rmse" else 100 * value


def digits(task: TaskSpec) -> str:
    """The format of a value on the paper's scale, with the paper's digits."""
    return ".3f" if task.metric == "rmse" else ".2f"


def fmt(task: TaskSpec, value: float) -> str:
    return format(scale(task, value), digits(task))


def metric_legend(tasks: list[TaskSpec]) -> str:
    parts = []
    for spec in tasks:
        unit = "" if spec.metric == "rmse" else " x100"
        extra = f", split {spec.dev_splits[0]}" if len(spec.dev_splits) > 1 else ""
        arrow = "higher is better" if spec.higher_is_better else "lower is better"
        parts.append(f"{COLUMN[spec.name]}: {spec.metric}{unit} ({arrow}{extra})")
    return "Columns: " + "; ".join(parts) + ".\n"


def markdown_row(label: str, tasks: list[TaskSpec], text: Callable[[TaskSpec], str | None]) -> str:
    """One table row: `text(task)` under each task's column, a dash where it gives None."""
    return f"| {label} | " + " | ".join(text(t) or "-" for t in tasks) + " |"


def cell_text(t: TaskSpec, c: Cell | None) -> str | None:
    if c is None:
        return None
    lo, hi = c.spread
    return f"{fmt(t, c.median)} <sub>({fmt(t, lo)}–{fmt(t, hi)})</sub>"


def delta_text(t: TaskSpec, d: dict | None) -> str | None:
    if d is None:
        return None
    star = "*" if d["significant"] else ""
    signed = "+" + digits(t)  # the cells' digits: READ's RMSE has 3
    return (f"{scale(t, d['delta']):{signed}}{star} <sub>[{scale(t, d['ci_low']):{signed}}, "
            f"{scale(t, d['ci_high']):{signed}}]</sub>")


def paper_row(name: str, vals: dict[str, float], tasks: list[TaskSpec]) -> str:
    return markdown_row(f"*paper: {name}*", tasks, lambda t: f"*{vals[t.name]:{digits(t)}}*" if t.name in vals else None)


def table(rows: dict[str, dict[TaskSpec, Cell]], tasks: list[TaskSpec], deltas: dict[str, dict[TaskSpec, dict]],
          against: dict[str, str], paper: dict[str, dict[str, float]] | None = None,
          paper_names: dict[str, str] | None = None) -> str:
    """Rows of 'median (min-max)'; under a row with deltas, its difference to the row `against[name]` with a 95%
    CI; under a row the paper has (keyed by our row's name), the paper's numbers, under the paper's name where
    `paper_names` gives one. The paper's rows we have no row for close the table."""
    paper, named = paper or {}, paper_names or {}
    out = ["| model | " + " | ".join(COLUMN[t.name] for t in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for name, cells in rows.items():
        out.append(markdown_row(name, tasks, lambda t: cell_text(t, cells.get(t))))
        if name in deltas:
            out.append(markdown_row(f"↳ Δ vs {against[name]}", tasks, lambda t: delta_text(t, deltas[name].get(t))))
        if name in paper:
            out.append(paper_row(named.get(name, name), paper[name], tasks))
    out += [paper_row(named.get(name, name), vals, tasks) for name, vals in paper.items() if name not in rows]
    return "\n".join(out) + "\n"


ADAPT_COLUMNS = (  # metrics/adapt/<family>/<variant>.json key, column, format
    ("steps", "steps", "{}"),
    ("valid_mlm_accuracy", "MLM acc.", "{:.3f}"),
    ("valid_mlm_perplexity", "MLM ppl.", "{:.1f}"),
    ("valid_match_accuracy", "MATCH acc.", "{:.3f}"),
    ("valid_match_majority", "MATCH majority", "{:.3f}"),
    ("valid_cliptc_accuracy", "CLIPTC acc.", "{:.3f}"),
)


def adaptation_table(metrics: dict[str, dict], family: str) -> str:
    """What each adaptation variant of `family` reached on held-out windows, beside the finetuning it led to."""
    lines = ["| variant | " + " | ".join(c for _, c, _ in ADAPT_COLUMNS) + " |", "|---|" + "---|" * len(ADAPT_COLUMNS)]
    for name, m in metrics.items():
        lines.append(f"| {name} | " + " | ".join(f.format(m[k]) if k in m else "-" for k, _, f in ADAPT_COLUMNS) + " |")
    return (f"\n## Adaptation (held-out valid windows, metrics/adapt/{family}/<variant>.json)\n\n" + "\n".join(lines)
            + "\n\nA dash: the variant does not train that loss. MATCH: each window sees another window's CLIP text with "
            "probability `adapt.match_prob` (the paper's 0.5); *MATCH majority* is the larger class's share of the "
            "sampled windows, what a model that learned nothing scores.\n")


def proposed_metric(adapt_metrics_dir: Path, family: str, key: str):
    """`key` of metrics/adapt/<family>/xdbert.json, which the family's `adapt@<family>` stage writes."""
    source = Path(adapt_metrics_dir) / family / f"{PROPOSED}.json"
    metrics = io.read_json(source)
    if key not in metrics:
        raise PipelineError(f"{source} has no `{key}`: rerun `dvc repro adapt@{family}`")
    return metrics[key]


def mechanism_note(result: dict | None) -> str:
    """The line under Table 1 saying what the mechanism study's gates found (results/mechanism.json, written
    by the `mechanism` stage); nothing when the study is off (`result` None)."""
    if result is None:
        return ""
    try:
        states = ", ".join(f"{name} {g['state']}" for name, g in sorted(result["gates"].items()))
        return f"\nMechanism study (reports/mechanism.md): gates {states}. {result['summary']}\n"
    except (KeyError, TypeError, AttributeError):
        raise PipelineError(f"{paths.MECHANISM_METRICS} holds no gates of the mechanism stage; rerun it "
                            "(`dvc repro mechanism`)") from None


def mlm_head_note(heads: dict[Family, str]) -> str:
    """How each family's MLM head started its adaptation (`mlm_head` of metrics/adapt/<family>/xdbert.json): a
    random head sends large random gradients into the encoder at first, so a family that starts from one is not
    on the same footing as one that starts from its checkpoint's head."""
    def how(source: str) -> str:
        if source.startswith("pretrained:"):
            return f"copied from the pretrained MLM head of `{source.removeprefix('pretrained:')}`"
        return ("random: its checkpoint ships no MLM head (as ELECTRA discriminators: theirs is the separate "
                "generator's, which is not loaded)")
    lines = [f"- {f.label}: {how(source)}" for f, source in heads.items()]
    return "\n## MLM head at the start of adaptation\n\n" + "\n".join(lines) + "\n"


def footnotes(n_boot: int) -> str:
    return (f"\nCells: median over seeds, with (min–max) across seeds. Δ rows: the difference of the medians to the row they "
            f"name (in Tables 1 and 8, the model's own family's baseline) with a 95% paired bootstrap interval over "
            f"dev examples ({n_boot} resamples, the same examples for both models and every seed); * marks an "
            f"interval that excludes 0.\n")


def models_line(s: AggregateSettings) -> str:
    """The header's `models:` line: each family's encoder and the CLIP tower, and where their weights come from."""
    encoders = [f"{f.label} `{s.encoders[name]}`"
                + (f" (pretrained on the corpus by `pretrain_encoder@{name}`)" if s.encoders[name].startswith(RANDOM_PREFIX) else "")
                for name, f in s.families.items()]
    clip_origin = s.clip_pretrained or (f"random init + {s.clip_steps} steps of next-token prediction on the corpus"
                                        if s.clip_steps else "random init")
    return f"encoders {', '.join(encoders)}; CLIP `{s.clip}` ({clip_origin})"


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
               f"models are rerun under it (runs `{s.study.ablation_family}/table3_<name>`), so every row of this "
               f"table shares it.")
    else:
        how = "Table 1's runs: its rate and seeds of each task (`finetune.ablation_lr` and `ablation_seeds` are null)."
    return (f"\nFinetuning: {how}\n\nNot reproduced: the paper's row *wiki (14G), same steps* adapts on a 14 GB "
            "Wikipedia dump for the steps of the wiki103 run; the `corpus` stage has no such source (it reads wiki103, "
            "or generates the embedded profile's text), so no run stands for it.\n")


# ----------------------------------------------------------------------------------------------------
# Tables 1, 3 and 8
# ----------------------------------------------------------------------------------------------------

def family_rows(f: Family, study: Study, full: bool) -> dict[str, str]:
    """A family's rows (label -> run): its baseline, which every Δ of the family is against; its adapted encoder
    where `finetune.models` has it; with `full` (Table 8), its whole cross-modal model where `finetune.full_models`
    has it. Both lists can only name the family's own adaptations (`Study.from_params`)."""
    rows = {f.label: run_name("encoder", BASELINE, f.name)}
    if PROPOSED in study.models:
        rows[f.xd_label] = run_name("encoder", PROPOSED, f.name)
    if full and PROPOSED in study.full_models:
        rows[f.full_label] = run_name("full", PROPOSED, f.name)
    return rows


class _Tables:
    """The three tables of one aggregate: every run's predictions read once, every Δ row's replicates drawn once."""

    def __init__(self, s: AggregateSettings, finetune_dir: Path):
        self.s, self.finetune_dir = s, Path(finetune_dir)
        self.preds: dict[tuple[str, TaskSpec], pd.DataFrame] = {}
        self.replicates: dict[tuple[str, TaskSpec], Replicates] = {}

    def load(self, run: str, task: TaskSpec) -> pd.DataFrame:
        if (run, task) not in self.preds:
            self.preds[run, task] = read_predictions(paths.predictions(task.name, run, self.finetune_dir))
        return self.preds[run, task]

    def resampled(self, run: str, task: TaskSpec) -> Replicates:
        """A run's bootstrap replicates, drawn once: a family's baseline and XD encoder are in several tables.
        Every run of a task is resampled from the same seed, so any two are paired."""
        if (run, task) not in self.replicates:
            self.replicates[run, task] = bootstrap_replicates(self.load(run, task), task, self.s.n_boot, self.s.seed)
        return self.replicates[run, task]

    def deltas(self, runs: dict[str, str], against: dict[str, str], tasks: list[TaskSpec]) -> dict[str, dict[TaskSpec, dict]]:
        return {label: {t: compare(self.resampled(runs[label], t), self.resampled(runs[base], t)) for t in tasks}
                for label, base in against.items() if label in runs}

    def render(self, title: str, runs: dict[str, str], tasks: list[TaskSpec], row_tasks: dict[str, list[TaskSpec]],
               against: dict[str, str], paper_rows: dict, extra: str = "", seeds: str = "",
               paper_names: dict[str, str] | None = None) -> tuple[str, dict]:
        """(markdown, results) of one table: a row per run label, its cells on `row_tasks[label]` (default `tasks`),
        a Δ row for each of them in `against` against the row it maps to; `seeds`: the header's seeds line
        (default Table 1's); the paper's rows as `table` shows them."""
        s = self.s
        body = {label: {t: cell(self.load(runs[label], t), t) for t in row_tasks.get(label, tasks)} for label in runs}
        d = self.deltas(runs, against, tasks)
        text = (header(title, s.profile, models_line(s), seeds or seeds_line(s)) + "\n" + metric_legend(tasks) + "\n"
                + table(body, tasks, d, against, paper_rows if s.profile == "paper" else None, paper_names)
                + footnotes(s.n_boot)
                + extra + "\n## Every metric (median over seeds)\n\n"
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


def render(s: AggregateSettings, finetune_dir: Path, adapt_metrics_dir: Path,
           mechanism: dict | None = None) -> tuple[dict[str, str], dict]:
    """({report name: markdown} of table1, table3 and table8, {report name: {row: {task: numbers}}});
    `mechanism`: results/mechanism.json when the mechanism study is on, whose gates a line under Table 1 gives."""
    study = s.study
    given = {t.name: t for t in s.tasks}
    every = [given[name] for name in COLUMN if name in given]  # the columns in the paper's order
    ablation_tasks = [t for t in every if t.name in study.ablation_tasks]
    fams = list(s.families.values())
    table1 = {label: r for f in fams for label, r in family_rows(f, study, full=False).items()}
    table8 = {label: r for f in fams for label, r in family_rows(f, study, full=True).items()}
    against = {label: f.label for f in fams for label in (f.xd_label, f.full_label)}  # each family's own baseline
    ablated = s.families[study.ablation_family]
    variants = study.table3_runs()
    table3 = {BASELINE: variants.pop(BASELINE, run_name("encoder", BASELINE, ablated.name)), **variants}
    adapted = {v: io.read_json(Path(adapt_metrics_dir) / ablated.name / f"{v}.json") for v in table3}
    heads = {f: proposed_metric(adapt_metrics_dir, f.name, "mlm_head") for f in fams}

    tables = _Tables(s, finetune_dir)
    rendered = {
        "table1": tables.render("Table 1: main results (dev sets)", {CLIP_ROW: run_name("clip", CLIP_MODEL), **table1},
                                every, {CLIP_ROW: [t for t in every if t.name in study.clip_tasks]}, against,
                                PAPER_TABLE1, mechanism_note(mechanism) + mlm_head_note(heads)),
        "table3": tables.render(f"Table 3: adaptation ablations ({ablated.label})", table3, ablation_tasks, {},
                                dict.fromkeys(variants, BASELINE), PAPER_TABLE3,
                                protocol_note(s) + adaptation_table(adapted, ablated.name), table3_seeds(s),
                                PAPER_TABLE3_NAMES),
        "table8": tables.render("Table 8: finetuning the full cross-modal model", table8, every, {}, against, PAPER_TABLE8),
    }
    return {name: text for name, (text, _) in rendered.items()}, {name: r for name, (_, r) in rendered.items()}


def results_csv(results: dict) -> str:
    """One row per (table, model, task): its median over seeds."""
    flat = [{"table": tb, "model": m, "task": t, "median": v["median"]} for tb, r in results.items()
            for m, ts in r.items() for t, v in ts.items()]
    return pd.DataFrame(flat).to_csv(index=False)


def tables_metrics(results: dict) -> dict:
    """metrics/tables.json, every cell of Tables 1, 3 and 8 (the medians): a plain output, not a metric, which
    `dvc metrics diff --targets metrics/tables.json` compares; `dvc exp show` shows the headline alone."""
    return {tb: {m: {t: round(v["median"], 6) for t, v in ts.items()} for m, ts in results[tb].items()}
            for tb in ("table1", "table3", "table8")}
