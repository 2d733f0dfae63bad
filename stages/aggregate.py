"""Stage `aggregate`: medians over seeds into reports/table1.md, table3.md and table8.md.

Reads every finetune run's dev predictions (results/finetune/<task>/<run>/predictions.parquet; runs are
the encoder names, `full_<variant>` for the whole cross-modal model and `clip_t` for CLIP's tower alone),
and for Table 3 each variant's adaptation metrics (metrics/adapt/<variant>.json).
"""
from pathlib import Path

from xdbert import io, params
from xdbert.stage import run

RESULTS = Path("results/finetune")
ADAPT_METRICS = Path("metrics/adapt")


def main() -> None:
    p = params.load()
    f, agg, tasks = params.section(p, "finetune"), params.section(p, "aggregate"), params.section(p, "tasks")
    n_boot = params.positive(agg["n_boot"], "aggregate.n_boot")

    import pandas as pd

    from xdbert import reports
    from xdbert.aggregate import bootstrap_replicates, cell, compare, read_predictions
    from xdbert.tasks.registry import get_task

    all_tasks = [t for t in reports.COLUMN if t in tasks["names"]]
    small = [t for t in all_tasks if t in f["ablation_tasks"]]
    preds: dict[tuple[str, str], pd.DataFrame] = {}

    def load(run_name: str, task: str) -> pd.DataFrame:
        if (run_name, task) not in preds:
            preds[run_name, task] = read_predictions(RESULTS / task / run_name / "predictions.parquet")
        return preds[run_name, task]

    xd = {"baseline": "baseline", **{m: m for m in f["models"] if m != "baseline"}}
    variants = {m: m for m in [*f["models"], *f["ablations"]] if m != "baseline"}
    full = {f"full {m}": f"full_{m}" for m in f["full_models"]}

    # Each (run, task) that a Δ row needs is resampled once: the baseline and xdbert are in all three tables.
    needed = sorted({(r, t) for runs, ts in [(xd, all_tasks), (variants, small), (full, all_tasks)]
                     for r in ["baseline", *runs.values()] for t in ts})
    replicates = {(r, t): bootstrap_replicates(load(r, t), t, n_boot, agg["seed"]) for r, t in needed}

    def deltas(runs: dict[str, str], task_list: list[str]) -> dict:
        return {label: {t: compare(replicates[r, t], replicates["baseline", t]) for t in task_list}
                for label, r in runs.items() if r != "baseline"}

    paper = p["profile"] == "paper"
    seeds = f"{len(f['seeds'])} per task ({', '.join(map(str, f['seeds']))}), {len(f['rte_seeds'])} for RTE"
    m, clip_steps = p["model"], p["pretrain"]["clip_steps"]
    encoder_origin = " (pretrained on the corpus by `pretrain_encoder`)" if m["encoder"].startswith("random:") else ""
    clip_origin = m["clip_pretrained"] or (f"random init + {clip_steps} steps of next-token prediction on the corpus"
                                          if clip_steps else "random init")
    models = f"encoder `{m['encoder']}`{encoder_origin}, CLIP `{m['clip']}` ({clip_origin})"
    results: dict = {}

    def write(name: str, title: str, runs: dict[str, str], task_list: list[str], row_tasks: dict[str, list[str]],
              compare: dict[str, str], paper_rows: dict, extra: str = "") -> None:
        body = {label: {t: cell(load(runs[label], t), t) for t in row_tasks.get(label, task_list)} for label in runs}
        d = deltas(compare, task_list)
        text = (reports.header(title, p["profile"], models, seeds) + "\n" + reports.metric_legend(task_list) + "\n"
                + reports.table(body, task_list, d, paper_rows if paper else None) + reports.footnotes(n_boot) + extra
                + "\n## Every metric (median over seeds)\n\n"
                + "\n".join(f"- {label} / {t}: " + ", ".join(f"{k} {v:.4f}" for k, v in c.all_metrics.items())
                            for label, cs in body.items() for t, c in cs.items())
                + extra_splits(runs, row_tasks, task_list) + "\n")
        io.write_text(Path("reports") / f"{name}.md", text)
        results[name] = {label: {t: {"median": c.median, "per_seed": c.per_seed, "metrics": c.all_metrics,
                                     **({"vs_baseline": d[label][t]} if label in d and t in d[label] else {})}
                                 for t, c in cs.items()} for label, cs in body.items()}

    def extra_splits(runs, row_tasks, task_list) -> str:
        lines = []
        for label, r in runs.items():
            for t in row_tasks.get(label, task_list):
                for split in get_task(t).dev_splits[1:]:
                    c = cell(load(r, t), t, split)
                    lines.append(f"- {label} / {t} {split}: {c.all_metrics} (median over seeds)")
        return ("\n\n## Other dev splits\n\n" + "\n".join(lines)) if lines else ""

    write("table1", "Table 1: main results (dev sets)", {"CLIP-T": "clip_t", **xd}, all_tasks,
          {"CLIP-T": [t for t in all_tasks if t in f["clip_tasks"]]}, xd, reports.PAPER_TABLE1)
    adapted = {v: io.read_json(ADAPT_METRICS / f"{v}.json") for v in ["baseline", *variants]}
    write("table3", "Table 3: adaptation ablations", {"baseline": "baseline", **variants}, small, {}, variants,
          reports.PAPER_TABLE3, reports.adaptation_table(adapted))
    write("table8", "Table 8: finetuning the full cross-modal model", {"baseline": "baseline", **xd, **full}, all_tasks,
          {}, {**xd, **full}, reports.PAPER_TABLE8)

    io.write_json("results/aggregate.json", results)
    flat = [{"table": tb, "model": m, "task": t, "median": v["median"]} for tb, r in results.items()
            for m, ts in r.items() for t, v in ts.items()]
    io.write_text("results/aggregate.csv", pd.DataFrame(flat).to_csv(index=False))
    # What `dvc exp show` / `dvc metrics diff` compare: the Table 1 and Table 3 medians.
    io.write_json("metrics/tables.json", {tb: {m: {t: round(v["median"], 6) for t, v in ts.items()} for m, ts in results[tb].items()}
                                          for tb in ("table1", "table3")})
    print("aggregate: wrote reports/table1.md, table3.md, table8.md")


if __name__ == "__main__":
    run(main)
