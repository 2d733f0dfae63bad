"""Which ingredient moves the facts? The mechanism study's exploratory sweep (issue 68, item 7).

    python bench/mechanism_sweep.py --project DIR [--work DIR] [--seeds 2,3] [--only NAME,...]

Each point of the sweep is a pair of adaptations of `adapt.family`'s encoder, one beside the facts tower and one
beside the twin tower, which differ in nothing else (`sweep_<x>` and `sweep_<x>_nofacts`): the XDBERT recipe at
MATCH weight 0 / 1 / 10 / 30 and at 1 / 2 / 4 adaptation epochs (1 epoch at weight 10 is XDBERT itself), and rung
T's KL control at weight 1 / 10 / 30. Each encoder is finetuned on `vis` and on the control task (SST-2) under
Table 1's protocol, and the pair is read as gate D reads XDBERT against `nofacts`: real minus twin on vis F+, with
the study's interval (objects, then seeds), and on the control task.

It runs on facts seeds other than the study's (0, 1) and the tuning seed's (100): each seed in its own folder of
--work, with the embedded profile's params, `mechanism.seed` and the sweep's variants set. The stages `tasks`,
`captions` and `pretrain_clip` run there as `dvc repro` runs them, then `adapt.py` for each variant; DIR is a
project after an embedded `dvc repro`, only read: its token shards, tokenizer and `pretrain_encoder`, which no
fact reaches. Finished adaptations and finetuning runs are kept in --work, so a second call trains only what is
missing. Exploratory: the numbers were fixed by no pre-registration, and the default `dvc repro` runs none of it.
Writes bench/results/mechanism_sweep.md, .json and .png; the JSON copied to inputs/replications/mechanism-sweep.json
is printed by the mechanism stage's report as an exploratory section (the stage depends on that folder).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from mechanism_ladder import LINKED, lever_params, prepare, stage  # noqa: E402  (it imports xdbert first)

import numpy as np  # noqa: E402

REFUSED = (0, 1, 100)  # the study's facts, D's replication, the tuning seed: the sweep reads none of them
RECIPE = {"losses": ["mlm", "match", "cliptc"], "cross_layers": 2}   # XDBERT's, as `adapt`'s defaults give it
WEIGHTS = {"mlm": 1.0, "match": 10.0, "cliptc": 1.0}
TWIN_TOWER = "pretrain_clip_nofacts"


class Point(NamedTuple):
    """One point of the sweep."""
    group: str   # its row's ingredient
    shown: str   # the swept value its row shows
    entry: dict  # the `adapt.variants` entry of its facts-tower side


def variants() -> dict[str, Point]:
    """Each point of the sweep, by its variant's name."""
    out = {}
    # weight 0 is MATCH off (a weight must be positive): no negative pairs either, CLIP beside each window's own text
    out["sweep_match0"] = Point("MATCH weight", "0", {"losses": ["mlm", "cliptc"], "cross_layers": 2,
                                                      "loss_weights": {"mlm": 1.0, "cliptc": 1.0}})
    for w in (1, 10, 30):
        shown = "10 (XDBERT; 1 epoch)" if w == 10 else str(w)
        out[f"sweep_match{w}"] = Point("MATCH weight", shown,
                                       {**RECIPE, "loss_weights": {**WEIGHTS, "match": float(w)}})
    for e in (2, 4):
        out[f"sweep_epochs{e}"] = Point("adaptation epochs", str(e), {**RECIPE, "loss_weights": WEIGHTS, "epochs": e})
    for w in (1, 10, 30):
        out[f"sweep_kl{w}"] = Point("T control's weight", str(w), {"losses": ["mlm", "kl"], "cross_layers": 0,
                                                                   "loss_weights": {"mlm": 1.0, "kl": float(w)}})
    return out


def seed_params(seed: int, names: list[str]) -> str:
    """The embedded profile's params with the facts seed, the sweep's variants and their twins, and the study's
    encoder rows replaced by them."""
    table = variants()
    entries = {}
    for name in names:
        entries[name] = table[name].entry
        entries[f"{name}_nofacts"] = {**table[name].entry, "clip_tower": TWIN_TOWER}
    items = [f"mechanism.seed={seed}", f"mechanism.models={json.dumps(list(entries))}"]
    items += [f"adapt.variants.{k}={json.dumps(v)}" for k, v in entries.items()]
    return lever_params(items)


def finetune(work: Path, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Each encoder of the work folder finetuned on vis and the control task (every seed of Table 1's protocol),
    on the grid as the finetune stage runs it: model -> task -> the (seeds, examples) correct matrix of the
    examples the study reads (vis dev in its kinds table's order; the control task's first dev split)."""
    from xdbert import io, paths
    from xdbert.analysis import mechanism as M
    from xdbert.data.mechanism import VIS, MechanismSettings
    from xdbert.data.tasks.registry import get_task
    from xdbert.finetuning.compute import data as fd
    from xdbert.finetuning.control.grid import run_grid
    from xdbert.finetuning.control.prepare import prepare as prepare_job
    from xdbert.finetuning.control.results import predictions_table
    from xdbert.finetuning.control.runs import Run, run_name
    from xdbert.finetuning.control.settings import FinetuneSettings
    from xdbert.model.families import ablation_family, families
    from xdbert.params import read_yaml_text

    os.chdir(work)  # the library reads the pipeline's relative paths
    p = read_yaml_text(Path("params.yaml").read_text(encoding="utf-8"))
    m = MechanismSettings.from_params(p)
    fam = ablation_family(p).name
    models = [n for name in names for n in (name, f"{name}_nofacts")]
    work_items, owners = [], []
    for task in (VIS, m.control_task):
        settings = FinetuneSettings.from_params(p, get_task(task), m)
        tables = fd.read_task(paths.TASKS, settings.task)
        for model in models:
            run = Run("encoder", model, run_name("encoder", model, fam), family=fam)
            job = prepare_job("encoder", run.model_dir, tables, settings, tokenizer_dir=paths.TOKENIZER,
                              run_cache=paths.run_cache(), family=families(p).get(fam))
            work_items.append((job, settings.seeds_of(run)))
            owners.append((task, model))
    order = io.read_parquet(paths.TASKS / VIS / paths.VIS_KINDS, "run stages/tasks.py").to_pandas().sort_values("idx")
    control_split = get_task(m.control_task).dev_splits[0]
    correct: dict[str, dict[str, np.ndarray]] = {}
    for (task, model), (job, _), results in zip(owners, work_items, run_grid(work_items)):
        preds = predictions_table(job, results).to_pandas()
        on_vis = task == VIS
        split, idx = ("dev", order["idx"].to_numpy()) if on_vis else (control_split, None)
        correct.setdefault(model, {})[task] = M.correct_matrix(preds, split, idx)[1]
    correct["_units"] = {"objects": order["object"].to_numpy(), "kinds": order["kind"].to_numpy()}
    return correct


def read_pairs(correct: dict, names: list[str], gates: dict, seed: int, control_task: str) -> dict[str, dict]:
    """Each pair's D: real minus twin on vis F+ (objects, then seeds) and on the control task, as gate D reads it."""
    from xdbert.analysis import mechanism as M
    from xdbert.data.mechanism import VIS

    objects, kinds = correct["_units"]["objects"], correct["_units"]["kinds"]
    out = {}
    for name in names:
        real, twin = correct[name], correct[f"{name}_nofacts"]
        f_plus = M.difference(real[VIS], twin[VIS], objects, kinds, "F+", gates, seed)
        control = M.difference(real[control_task], twin[control_task], None, None, None, gates, seed)
        out[name] = {"f_plus": M.interval_json(f_plus), "control": M.interval_json(control)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True, help="a project after an embedded `dvc repro` (read only)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mechanism_sweep"))
    ap.add_argument("--seeds", default="2,3", help="facts seeds, comma-separated (never 0, 1 or 100)")
    ap.add_argument("--only", default="", help="variants to run, comma-separated (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    table = variants()
    names = args.only.split(",") if args.only else list(table)
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise SystemExit(f"--only: unknown variants {unknown}; allowed: {', '.join(table)}")
    seeds = [int(x) for x in args.seeds.split(",")]
    if set(seeds) & set(REFUSED):
        raise SystemExit(f"--seeds {args.seeds}: {sorted(set(seeds) & set(REFUSED))} belong to the study (0, 1) or its "
                         f"calibration (100); the sweep is exploratory and reads other facts")

    from provenance import code_version, describe
    from xdbert.analysis.mechanism import sweep_markdown
    from xdbert.data.mechanism import MechanismSettings
    from xdbert.params import read_yaml_text

    project, out = args.project.resolve(), args.out.resolve()
    result = {**code_version(), "exploratory": True, "seeds": seeds, "variants": {n: table[n].entry for n in names},
              "rows": [{"variant": n, "ingredient": table[n].group, "value": table[n].shown} for n in names],
              "seconds": {}, "pairs": {}}
    for seed in seeds:
        work = (args.work / f"seed{seed}").resolve()
        work.mkdir(parents=True, exist_ok=True)
        text = seed_params(seed, names)
        prepare(project, work, text, LINKED + ("inputs",))
        m = MechanismSettings.from_params(read_yaml_text(text))
        family = read_yaml_text(text)["adapt"]["family"]
        seconds = {s: stage(work, f"{s}.py") for s in ("tasks", "captions")}
        if not (work / "models" / TWIN_TOWER).is_dir():  # the towers of an earlier call are kept
            seconds["pretrain_clip"] = stage(work, "pretrain_clip.py")
        for name in names:
            for model in (name, f"{name}_nofacts"):
                if not (work / "models" / "adapted" / family / model / "config.json").exists():
                    seconds[model] = stage(work, "adapt.py", family, model)
        here = Path.cwd()
        correct = finetune(work, names)
        os.chdir(here)
        result["seconds"][str(seed)] = seconds
        result["pairs"][str(seed)] = read_pairs(correct, names, m.gates, seed, m.control_task)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mechanism_sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    markdown = "\n".join(["# Mechanism study, exploratory: which ingredient moves the facts (issue 68, item 7)", "",
                          describe(result), "", *sweep_markdown(result), "", "![F+ difference per variant](mechanism_sweep.png)", ""])
    (out / "mechanism_sweep.md").write_text(markdown)
    plot(result, out / "mechanism_sweep.png")
    print(markdown)


def plot(result: dict, path: Path) -> None:
    """F+ difference and its interval per variant, a marker per facts seed; zero marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["variant"] for row in result["rows"]]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for k, s in enumerate(result["seeds"]):
        xs = np.arange(len(names)) + (k - (len(result["seeds"]) - 1) / 2) * 0.2
        pairs = [result["pairs"][str(s)][n]["f_plus"] for n in names]
        est = np.array([p["estimate"] for p in pairs])
        err = np.array([[p["estimate"] - p["low"] for p in pairs], [p["high"] - p["estimate"] for p in pairs]])
        ax.errorbar(xs, est, yerr=err, fmt="o", capsize=3, label=f"facts seed {s}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), [f"{row['ingredient']} {row['value']}" for row in result["rows"]], fontsize=7,
                  rotation=30, ha="right")
    ax.set_ylabel("vis F+: real - twin tower")
    ax.set_title("Exploratory: which ingredient moves the facts", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    main()
