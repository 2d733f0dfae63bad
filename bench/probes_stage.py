"""The `probes` stage's time and peak memory at the paper's sizes, random weights, through the stage's own code.

The rows are the paper profile's (xdbert.analysis.probe_rows `study_rows`), each loaded by its `load_row` and
probed by xdbert.analysis.probes `probe` with the profile's `probes` settings (cv_folds, n_boot) and `--jobs` cores,
on ViComTe and CoDa at their real sizes (xdbert.mirror's `--sizes paper`: made-up subjects and templates, the real
counts).

First it writes, in a temporary project folder (the stage reads every path relative to the cwd), what the stage
reads there, with random weights at the released configs: each row's adapted encoder (models/adapted, by
`save_adapted`), the MLM heads of the baselines and the caption control (models/crossmodal, by `save_full`: the
family's encoder, no cross layers, the MLM loss), CLIP ViT-B-32's text tower (models/pretrain_clip),
bert-base-uncased's WordPiece (models/tokenizer), ViComTe's files, and a hub mirror of CoDa and the reference
encoder that the folder's hub.lock.json pins. Then the stage runs in a child process, offline against that mirror
as `xdbert rehearse` runs it, so that the peak memory is the stage's own and not the writing's.

Reported per row: seconds loading, computing the linear probe's features (the encoder's forward passes), running
the cloze (ViComTe's and CoDa's, where the row has a head) and the rest (the linear probes' fits); the differences'
paired bootstraps after the last row; the peak RSS of the stage's process and of its largest joblib worker (they
fit the templates). Each is the process's own VmHWM: getrusage's ru_maxrss counts, in a forked child, the RSS of
the parent it started from, and joblib reaps idle workers after 300 s, so the workers are read after each row's fits.

On a subset of the rows, an extrapolation to all of them: each row of the profile costs what the measured rows of
its kind did (a base or large encoder, with or without an MLM head, CLIP-T, the reference); an encoder without a
head, where none of its kind was measured, what its size's rows with a head did less their cloze; the bootstraps
what they did per comparison (an XD row and its baseline make one).

`--fraction` keeps the first share of each ViComTe split's examples and of CoDa's test objects, so that the paper
profile's rows fit in an hour on 2 cores, and extrapolates each row's features, cloze and fits, and the bootstraps,
to all the subjects; a row's load and the reading of the files stay as measured. With one share F each part is
scaled by 1/F, a line through the origin: right for the forward passes (a fixed batch size), an overestimate for
the fits, which also pay a fixed cost per template and fold. With two shares (`--fraction 0.08,0.04`, measured on the
same project, cut to the larger first) each part follows the line through both measurements to F = 1, which
separates that fixed part (docs/notebook, the thirtieth session).

    python bench/probes_stage.py --representative         # one row of each kind, extrapolated to every row
    python bench/probes_stage.py --representative --fraction 0.08,0.04   # 34 min on 2 idle cores
    python bench/probes_stage.py --only bert-b/baseline,bert-b/xdbert,electra-l/baseline,clip_t,bert-base-cased
    python bench/probes_stage.py --only bert-b/baseline --relations shape
    python bench/probes_stage.py --sizes tiny             # the quick check: tiny encoders, tiny ViComTe and CoDa

Writes bench/results/probes_stage.md and .json (or under --out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import xdbert  # noqa: F401  (first: it fixes the CPU kernels and threads before torch and numpy load, as in the stage)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import code_version, describe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEASURED = "measured.json"  # what the child process writes in the project folder
REFERENCE_KEY, CODA_KEY = "probes.reference", "probes.coda_hub_id"
HEAD = " with MLM head"  # in a kind of row: an encoder whose MLM head runs the cloze


def paper_params() -> dict:
    from xdbert import profiles

    return profiles.values("paper")


def kind_of(row, p: dict) -> str:
    """What a row costs like: CLIP-T, the reference, or a family's encoder by its size, with or without an MLM head."""
    if row.kind == "clip":
        return "CLIP-T"
    if row.kind == "hub":
        return "reference (hub MLM)"
    return f"{p['families'][row.family]['size']} encoder" + (HEAD if row.head else "")


def chosen_rows(args, rows: list, p: dict) -> list:
    """The rows `--only` names, or the first of each kind (`--representative`), or all, in the profile's order."""
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {r.name for r in rows})
        if unknown:
            raise SystemExit(f"unknown rows {unknown}; the paper profile's: {', '.join(r.name for r in rows)}")
        return [r for r in rows if r.name in names]
    if args.representative:
        first = {}
        for r in rows:
            first.setdefault(kind_of(r, p), r)
        return [r for r in rows if r in first.values()]
    return rows


# ----------------------------------------------------------------------------------------------------
# The project folder: what the stage reads, random weights at the released configs
# ----------------------------------------------------------------------------------------------------

def write_project(project: Path, rows: list, relations: list[str], sizes: str, p: dict, say) -> None:
    from transformers import AutoTokenizer

    from xdbert import io, mirror, mirror_probes, rehearse
    from xdbert.data.probes import ProbesSettings
    from xdbert.model.clip_tower import CLIPTextTower, clip_uses_quick_gelu
    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import save_adapted, save_clip_tower, save_full
    from xdbert.model.settings import ModelSettings
    from xdbert.paths import PRETRAIN_CLIP, TOKENIZER

    s = ProbesSettings.from_params(p)
    model = ModelSettings.from_params(p)
    encoders = project / "encoders"  # the hub's encoders as xdbert.mirror writes them
    # models/tokenizer as dual_tokenize leaves it: `model.encoder`'s tokenizer, saved
    mirror.write_encoder(encoders / model.encoder, model.encoder, sizes, model.seed)
    AutoTokenizer.from_pretrained(str(encoders / model.encoder)).save_pretrained(str(project / TOKENIZER))
    for family in dict.fromkeys(r.family for r in rows if r.family):
        repo = ModelSettings.from_params(p, family).encoder
        if not (encoders / repo).is_dir():
            mirror.write_encoder(encoders / repo, repo, sizes, model.seed)
        # every row of the family: its encoder, and an MLM head on it (no cross layers), as the baseline saves it
        full = XDBertModel.build(XDBertConfig(encoder=str(encoders / repo), clip=model.clip, cross_layers=0, losses=["mlm"]))
        for r in rows:
            if r.family == family:
                save_adapted(full, project / r.source, project / TOKENIZER)
                if r.head:
                    save_full(full, project / r.head)
        say(f"{family}: {repo} ({sizes}), random weights, saved for its rows")
    if any(r.kind == "clip" for r in rows):
        quick_gelu = clip_uses_quick_gelu(model.clip, model.clip_pretrained)
        save_clip_tower(CLIPTextTower.build(model.clip, "", quick_gelu), project / PRETRAIN_CLIP, model.clip, model.clip_pretrained)
    for relation in relations:
        mirror_probes.write_vicomte(project / s.vicomte_dir, relation, model.seed, sizes)
    mirror_probes.write_vicomte_coda(project / s.vicomte_dir)
    keys = {CODA_KEY} | ({REFERENCE_KEY} if any(r.kind == "hub" for r in rows) else set())
    entries = mirror.build_mirror(p, project / rehearse.CACHE / "hub", sizes, say, keys=keys)
    io.write_json(project / "hub.lock.json", {"profile": p["profile"], "assets": entries})


def keep_share(project: Path, relations: list[str], fraction: float, p: dict, written: dict[Path, str]) -> None:
    """Cut the written ViComTe splits to their first `fraction` of examples and CoDa's test split to its first
    `fraction` of objects (at least one of each), counted on the files as written, which `written` keeps from the
    first cut on. The single group's examples are the first of the all group's, so they stay a subset."""
    import math

    from huggingface_hub.file_download import repo_folder_name

    from xdbert import rehearse
    from xdbert.data.probes import ProbesSettings
    from xdbert.data.vicomte import FILES, files
    from xdbert.hub_layouts import DATASETS

    def keep(n: int) -> int:
        return max(1, math.ceil(fraction * n))

    s = ProbesSettings.from_params(p)
    for relation in relations:
        for name, path in zip(FILES, files(project / s.vicomte_dir, relation)):
            if "/" in name:  # a group's split (the others are the words, templates and distributions)
                lines = written.setdefault(path, path.read_text(encoding="utf-8")).splitlines(keepends=True)
                path.write_text("".join(lines[:keep(len(lines))]), encoding="utf-8")
    repo = project / rehearse.CACHE / "hub" / repo_folder_name(repo_id=s.coda_hub_id, repo_type="dataset")
    for path in repo.glob(f"snapshots/*/{DATASETS[s.coda_hub_id]['data_files']['test']}"):
        rows = [json.loads(line) for line in written.setdefault(path, path.read_text(encoding="utf-8")).splitlines()]
        objects = list(dict.fromkeys(r["class_id"] for r in rows))
        kept = set(objects[:keep(len(objects))])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["class_id"] in kept), encoding="utf-8")


# ----------------------------------------------------------------------------------------------------
# The child process: the stage's computation, timed row by row
# ----------------------------------------------------------------------------------------------------

def peak_mib(pid: int | str) -> float:
    """Process `pid`'s own peak RSS (VmHWM: its memory since its exec), 0 if it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) / 1024


def children_peak_mib() -> float:
    """The largest own peak RSS among this process's live children (joblib's workers)."""
    me, peaks = os.getpid(), [0.0]
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                peaks.append(peak_mib(d.name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while listed
    return max(peaks)


def measure(args) -> None:
    """In the project folder (the cwd): the probes study's `probe` on the chosen rows; writes MEASURED."""
    from xdbert.analysis import probes as study
    from xdbert.analysis.probe_rows import load_row, study_rows
    from xdbert.data.coda import load_coda
    from xdbert.data.probes import ProbesSettings
    from xdbert.data.vicomte import load_coda_templates, load_relation

    p = paper_params()
    s = ProbesSettings.from_params(p)
    rows = chosen_rows(args, study_rows(p, s.reference), p)
    start = time.perf_counter()
    relations = {r: load_relation(s.vicomte_dir, r) for r in args.relations}
    coda, coda_templates = load_coda(s.coda_hub_id), load_coda_templates(s.vicomte_dir)
    data_seconds = time.perf_counter() - start
    times, current, workers = {}, {}, [0.0]

    def timed(kind: str, f):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                times[current["row"]][kind] += time.perf_counter() - t
        return call

    def load(row):
        current.update(row=row.name, start=time.perf_counter())
        times[row.name] = {"load": 0.0, "features": 0.0, "cloze": 0.0}
        loaded = timed("load", load_row)(row)
        return loaded._replace(features=timed("features", loaded.features))

    def say(line: str) -> None:
        t = times[current["row"]]
        t["wall"] = time.perf_counter() - current["start"]
        t["rest"] = t["wall"] - t["load"] - t["features"] - t["cloze"]
        workers.append(children_peak_mib())  # the row's fits are done; its workers are still there
        print(f"{line} ({t['wall']:.1f} s)", flush=True)

    study.cloze_scores = timed("cloze", study.cloze_scores)  # the study's own, timed: row_outputs calls it by name
    results = study.probe(rows, load, relations, coda, coda_templates, cv_folds=s.cv_folds, n_boot=s.n_boot,
                          jobs=args.jobs, say=say)
    total = time.perf_counter() - start
    Path(MEASURED).write_text(json.dumps({
        "rows": [{"name": r.name, "kind": kind_of(r, p), **times[r.name]} for r in rows],
        "data_seconds": data_seconds, "differences_seconds": total - data_seconds - sum(t["wall"] for t in times.values()),
        "comparisons": len(study.comparisons(results["models"])), "total_seconds": total,
        "peak_rss_mib": {"stage": peak_mib("self"), "children": max(workers)},
        "cv_folds": s.cv_folds, "n_boot": s.n_boot, "templates": {r: len(v.templates) for r, v in relations.items()},
        "subjects": {r: len(study.subjects_of(v)) for r, v in relations.items()},
        "coda_objects": len(study.coda_test_objects(coda))}, indent=2) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------------------------
# The parent: the project, the child, the extrapolation and the report
# ----------------------------------------------------------------------------------------------------

def at_all_subjects(points: dict[float, float]) -> float:
    """A time measured at one or two shares of the subjects, {share: seconds}, at share 1: the line through the
    origin and the one point, or through the two points."""
    if len(points) == 1:
        ((f, y),) = points.items()
        return y / f
    (f1, y1), (f2, y2) = sorted(points.items())
    return y2 + (y2 - y1) * (1 - f2) / (f2 - f1)


def scale(measured: dict[float, dict]) -> dict:
    """The measurement as it would be on all the subjects, from the ones at each share ({share: measured}, the same
    rows): each row's features, cloze and rest (its fits) and the differences' bootstraps extrapolated by
    `at_all_subjects`; its load, the reading of the files and the rest as measured at the largest share."""
    largest = measured[max(measured)]
    rows = []
    for i, r in enumerate(largest["rows"]):
        parts = {k: at_all_subjects({f: m["rows"][i][k] for f, m in measured.items()}) for k in ("features", "cloze", "rest")}
        rows.append({**r, **parts, "wall": r["load"] + sum(parts.values())})
    differences = at_all_subjects({f: m["differences_seconds"] for f, m in measured.items()})
    return {**largest, "rows": rows, "differences_seconds": differences}


def extrapolate(measured: dict, all_rows: list, p: dict) -> dict:
    """Every row of the profile at the mean wall seconds of the measured rows of its kind, or, for an encoder without
    a head that none was measured of, of its size's rows with a head less their cloze (the same load, features and
    fits); the bootstraps at the measured seconds per comparison. `missing`: kinds neither gives (then no total)."""
    from xdbert.analysis.probes import comparisons

    measured_kinds: dict[str, list[dict]] = {}
    for r in measured["rows"]:
        measured_kinds.setdefault(r["kind"], []).append(r)
    mean = lambda rows, less_cloze: sum(r["wall"] - less_cloze * r["cloze"] for r in rows) / len(rows)
    kinds = {}
    for kind, n in Counter(kind_of(r, p) for r in all_rows).items():
        if kind in measured_kinds:
            kinds[kind] = {"rows": n, "seconds_per_row": mean(measured_kinds[kind], False), "from": "measured"}
        elif kind + HEAD in measured_kinds:
            kinds[kind] = {"rows": n, "seconds_per_row": mean(measured_kinds[kind + HEAD], True),
                           "from": f"{kind}{HEAD}, less the cloze"}
        else:
            kinds[kind] = {"rows": n, "seconds_per_row": None, "from": None}
    missing = [k for k, v in kinds.items() if v["from"] is None]
    n_comparisons = len(comparisons([r.entry() for r in all_rows]))
    per_comparison = measured["differences_seconds"] / measured["comparisons"] if measured["comparisons"] else None
    differences = per_comparison * n_comparisons if per_comparison is not None else None
    total = None
    if not missing and differences is not None:
        total = measured["data_seconds"] + differences + sum(v["rows"] * v["seconds_per_row"] for v in kinds.values())
    return {"rows": len(all_rows), "kinds": kinds, "missing": missing, "comparisons": n_comparisons,
            "differences_seconds": differences, "total_seconds": total}


def markdown(result: dict) -> str:
    at = {float(f): m for f, m in result["measured_at"].items()}
    m, x, full = at[max(at)], result["extrapolated"], scale(at)
    cell = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
    shares = " and ".join(f"{f:g}" for f in sorted(at, reverse=True))
    lines = [f"# The probes stage's time and peak memory, {result['sizes']} sizes, random weights", "",
             f"`{result['command']}`. {describe(result)}", "",
             f"{result['machine']}; {result['jobs']} jobs (joblib's template fits); load average {result['load_average']} "
             f"at the start. Relations {', '.join(result['relations'])}: subjects {m['subjects']}, templates "
             f"{m['templates']}; CoDa test objects {m['coda_objects']}; {m['cv_folds']}-fold template choice, {m['n_boot']} "
             f"bootstrap resamples.", "",
             *([f"Measured on the first {shares} of each ViComTe split and of CoDa's test objects (the figures above are the "
                f"larger share's); the rows marked \"all\" are extrapolated to all the subjects "
                f"({'through the two shares' if len(at) == 2 else 'in proportion: the fits an upper bound'}), and the "
                "extrapolation below starts from them.", ""] if min(at) < 1 else []),
             "| row | kind | share | load s | features s | cloze s | rest (probe fits) s | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(m["rows"]):
        shown = [(f"{f:g}", at[f]["rows"][i]) for f in sorted(at, reverse=True)]
        if min(at) < 1:
            shown.append(("all", full["rows"][i]))
        for share, row in shown:
            lines.append(f"| {r['name']} | {r['kind']} | {share} | {row['load']:.1f} | {row['features']:.1f} | "
                         f"{cell(row['cloze'])} | {row['rest']:.1f} | {row['wall']:.1f} |")
    rss = m["peak_rss_mib"]
    lines += ["", "The first row also pays what the stage pays once: its load the imports, its rest joblib's workers starting.",
              "", f"Reading ViComTe and CoDa: {m['data_seconds']:.1f} s; the differences' bootstraps after the last row "
              f"({m['comparisons']} comparisons): {m['differences_seconds']:.1f} s; measured in all {m['total_seconds']:.1f} s "
              f"({m['total_seconds'] / 60:.1f} min).",
              f"Peak RSS (each process its own VmHWM): the stage's process {rss['stage']:,.0f} MiB, its largest joblib worker {rss['children']:,.0f} MiB.",
              "", f"## Extrapolated to the paper profile's {x['rows']} rows (these relations)", "",
              "| kind | rows | s per row | from |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['rows']} | {cell(v['seconds_per_row'])} | {v['from'] or '-'} |" for k, v in x["kinds"].items()]
    if x["total_seconds"] is not None:
        lines += ["", f"Bootstraps of {x['comparisons']} comparisons: {x['differences_seconds']:.1f} s. Total: "
                  f"{x['total_seconds']:.0f} s ({x['total_seconds'] / 3600:.2f} h)."]
    else:
        lines += ["", "No total: " + (f"no row measured that gives {', '.join(x['missing'])}" if x["missing"]
                                      else "no comparison measured, so no bootstrap time per comparison") + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    from xdbert.data.vicomte import RELATIONS
    from xdbert.mirror import SIZES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", choices=SIZES, default="paper", help="tiny: the mirror's tiny encoders, ViComTe and CoDa")
    ap.add_argument("--only", default="", help="comma-separated row names (default: every row)")
    ap.add_argument("--representative", action="store_true", help="the first row of each kind")
    ap.add_argument("--relations", default=",".join(RELATIONS))
    ap.add_argument("--fraction", default="1",
                    help="keep this share of each ViComTe split and of CoDa's test objects, or two shares, comma-separated; "
                         "extrapolate the times to all the subjects")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="the stage's `jobs` (default: the cores it may use)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process, in the project folder
    args = ap.parse_args()
    args.relations = args.relations.split(",")
    try:
        fractions = sorted({float(f) for f in args.fraction.split(",")}, reverse=True)
    except ValueError:
        fractions = []
    if not 1 <= len(fractions) <= 2 or len(fractions) != len(args.fraction.split(",")) or not all(0 < f <= 1 for f in fractions):
        raise SystemExit(f"--fraction {args.fraction!r}: one or two different shares of the subjects in (0, 1], comma-separated")
    if args.measure:
        measure(args)
        return
    from xdbert import rehearse
    from xdbert.analysis.probe_rows import study_rows
    from xdbert.data.probes import ProbesSettings
    from xdbert.numerics import cpu_description

    p = paper_params()
    all_rows = study_rows(p, ProbesSettings.from_params(p).reference)
    rows = chosen_rows(args, all_rows, p)
    load_average = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="probes-bench-") as tmp:
        project = Path(tmp)
        write_project(project, rows, args.relations, args.sizes, p, say=lambda line: print(line, flush=True))
        env = rehearse.offline_env(project)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])  # this checkout's code, not an installed copy
        child = [sys.executable, str(Path(__file__).resolve()), "--measure", "--only", ",".join(r.name for r in rows),
                 "--relations", ",".join(args.relations), "--jobs", str(args.jobs)]
        measured, written = {}, {}
        for fraction in fractions:  # the larger first: a cut keeps the first lines of the one before
            if fraction < 1:
                keep_share(project, args.relations, fraction, p, written)
            subprocess.run(child, cwd=project, env=env, check=True)
            measured[fraction] = json.loads((project / MEASURED).read_text(encoding="utf-8"))
    result = {**code_version(), "command": shlex.join(["python", *sys.argv]), "sizes": args.sizes, "fractions": fractions,
              "machine": f"{cpu_description().get('model name', platform.machine())}, {len(os.sched_getaffinity(0))} cores",
              "load_average": load_average, "jobs": args.jobs, "relations": args.relations,
              "measured": measured[fractions[0]], "measured_at": {str(f): m for f, m in measured.items()},
              "extrapolated": extrapolate(scale(measured), all_rows, p)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probes_stage.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (args.out / "probes_stage.md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))


if __name__ == "__main__":
    main()
