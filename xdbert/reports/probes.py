"""reports/probes.md: the visual-knowledge probes of issue 56 (../shared/PROBES.md) from the results dict of the probes
study (xdbert.analysis.probes, whose docstring describes it).

`render(results)` returns the markdown; the stage writes it (xdbert.io.write_text) beside the results
(xdbert.io.write_json). Figures are fractions in the dict; the report prints them x100, beside the published figures
(`ANCHORS`), and checks that the reference row and CLIP-T reproduce them within their noise. It refuses a results
dict that lacks a difference the report shows (`comparisons`), and columns whose rows have different n.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from xdbert.analysis.probes import CODA_COLUMNS, VICOMTE_COLUMNS, check_models, comparisons
from xdbert.reports.header import header

ROLE_TEXT = {"baseline": "baseline", "xd": "XD", "caption_control": "caption control", "reference": "reference",
             "clip": "CLIP-T"}
RELATIONS = ("color", "shape", "material")
GROUPINGS = ("all", "single")
GROUPING_TEXT = {"all": "all groups", "single": "single group"}
PROVENANCE = "from the authors' repository, not checked against the paper"
NOISE_SE = 2  # "within their noise": within this many standard errors

# The published figures (PROBES.md, [R]): the reference row's, CLIP-T's and two models we have no row for.
# (role or None, relation, grouping, column, value x100, who, source file)
CLS_FILE = "probing/file-cls-groups.csv @ db55d11"
HEATMAP_FILE = "heatmap_data.csv @ 00883c6"
ANCHORS = (
    ("reference", "color", "single", "linear.oracle.accuracy", 54.8, "bert-base-cased", CLS_FILE),
    ("reference", "shape", "single", "linear.oracle.accuracy", 83.0, "bert-base-cased", CLS_FILE),
    ("reference", "material", "single", "linear.oracle.accuracy", 51.6, "bert-base-cased", CLS_FILE),
    ("clip", "color", "single", "linear.oracle.accuracy", 66.3, "CLIP ViT-B/32 text", CLS_FILE),
    ("clip", "shape", "single", "linear.oracle.accuracy", 90.0, "CLIP ViT-B/32 text", CLS_FILE),
    ("clip", "material", "single", "linear.oracle.accuracy", 64.1, "CLIP ViT-B/32 text", CLS_FILE),
    ("reference", "color", "all", "zero_shot.spearman", 47.5, "bert-base-cased", HEATMAP_FILE),
    (None, "color", "all", "zero_shot.spearman", 55.8, "a BERT trained on captions alone", HEATMAP_FILE),
    (None, "color", "all", "zero_shot.spearman", 53.7, "an Oscar-distilled BERT", HEATMAP_FILE),
    ("reference", "coda", None, "coda.vicomte.spearman", 46.2,
     "bert-base-cased (ViComTe's zero-shot on its CoDa split, its 9 templates, best template)", HEATMAP_FILE),
)


# ----------------------------------------------------------------------------------------------------
# Reading a column
# ----------------------------------------------------------------------------------------------------

def entry_of(entry_set: Mapping, column: str, model: str) -> Mapping | None:
    """The dict of `model`'s figures that `column` reads in a grouping or in CoDa (CoDa's "coda.vicomte.*" columns:
    the row's "vicomte" entry); None where it has none."""
    probe, *rest = column.split(".")
    if probe in ("linear", "zero_shot"):
        return entry_set.get(probe, {}).get(model)
    entry = entry_set.get("rows", {}).get(model)
    for key in rest[:-1]:
        entry = None if entry is None else entry.get(key)
    return entry


def figure(entry_set: Mapping, column: str, model: str) -> tuple[float, int, int | None] | None:
    """(value, n, template or None) of `model` in a grouping's or CoDa's `column`; None where it has none."""
    probe, *rest = column.split(".")
    entry = entry_of(entry_set, column, model)
    if entry is None:
        return None
    if probe == "linear":
        choice, metric = rest
        n = entry["n"] if metric == "accuracy" else entry["n_spearman"]
        return entry[choice][metric], n, entry[choice][f"{metric}_template"]
    if probe == "zero_shot":
        (metric,) = rest
        return entry[metric], entry["n"] if metric == "accuracy" else entry["n_spearman"], None
    return entry[rest[-1]], entry["n"], None


def column_n(entry_set: Mapping, column: str, models: Sequence[str], where: str) -> int | None:
    """The n of a column, the same for every row that has it (ValueError otherwise: not the same subjects)."""
    ns = {m: f[1] for m in models if (f := figure(entry_set, column, m)) is not None}
    if len(set(ns.values())) > 1:
        raise ValueError(f"{where}, {column}: the rows have different n {ns}; they must be on the same subjects")
    return next(iter(ns.values()), None)


# ----------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------

def pct(value: float) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.1f}"


def signed(value: float) -> str:
    return f"{100 * value:+.1f}"


def difference_text(d: Mapping) -> str:
    return f"{signed(d['estimate'])} [{signed(d['low'])}, {signed(d['high'])}]"


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def grouping_table(relation: str, grouping: str, g: Mapping, models: Sequence[Mapping]) -> list[str]:
    """One (relation, grouping): n and the majority line first, a row per model, the published figures
    under the row they belong to, then the paired differences."""
    where = f"vicomte.{relation}.{grouping}"
    columns = list(VICOMTE_COLUMNS)
    names = [m["name"] for m in models]
    unknown = (set(g.get("linear", {})) | set(g.get("zero_shot", {}))) - set(names)
    if unknown:
        raise ValueError(f"{where}: rows {sorted(unknown)} are not in `models`")
    ns = {c: column_n(g, c, names, where) for c in columns}
    lines = {c: g["majority"][c.split(".")[0]] for c in columns}  # the linear probe's line or the cloze's
    for c in columns:
        if c.endswith("accuracy") and ns[c] is not None and ns[c] != lines[c]["n"]:
            raise ValueError(f"{where}, {c}: the majority line is on {lines[c]['n']} subjects and the column on {ns[c]}; "
                             f"a line must be on the subjects its column scores")
    classes = "/".join(dict.fromkeys(line["class"] for line in lines.values()))
    majority = {c: lines[c]["accuracy" if c.endswith("accuracy") else "prior_spearman"] for c in columns}
    out = [f"### {relation}, {GROUPING_TEXT[grouping]} ({g['n_test']} test subjects)", "",
           row(["model", "role", *(VICOMTE_COLUMNS[c] for c in columns)]), "|---" * (len(columns) + 2) + "|",
           row(["*n*", "", *(str(ns[c]) if ns[c] is not None else "-" for c in columns)]),
           row([f"*majority class ({classes}); ρ: class prior; each on its column's subjects*", "",
                *(pct(majority[c]) for c in columns)])]
    for m in models:
        figures = {c: figure(g, c, m["name"]) for c in columns}
        if all(f is None for f in figures.values()):
            continue
        out.append(row([m["name"], ROLE_TEXT[m["role"]], *(cell(figures[c]) for c in columns)]))
        out += [anchor_row(a, columns) for a in ANCHORS if a[0] == m["role"] and a[1:3] == (relation, grouping)]
    out += [anchor_row(a, columns) for a in ANCHORS if a[0] is None and a[1:3] == (relation, grouping)]
    return out + [""] + differences_table(g, columns, VICOMTE_COLUMNS, models, where)


def cell(f: tuple[float, int, int | None] | None) -> str:
    if f is None:
        return "-"
    value, _, template = f
    return pct(value) + (f" <sub>t{template}</sub>" if template is not None else "")


def anchor_row(anchor: tuple, columns: Sequence[str]) -> str:
    _, _, _, column, value, who, source = anchor
    return row([f"*published, {PROVENANCE}: {who} ({source})*", "",
                *(f"*{value:.1f}*" if c == column else "" for c in columns)])


def differences_table(entry_set: Mapping, columns: Sequence[str], headers: Mapping[str, str], models: Sequence[Mapping],
                      where: str) -> list[str]:
    """Every comparison in every column where both rows have a figure; ValueError where the results lack one."""
    given = {(d["a"], d["b"], d["column"]): d for d in entry_set.get("differences", [])}
    lines = []
    for a, b in comparisons(models):
        cells = []
        for c in columns:
            if figure(entry_set, c, a) is None or figure(entry_set, c, b) is None:
                cells.append("-")
                continue
            if (a, b, c) not in given:
                raise ValueError(f"{where}: the results lack the difference {a} - {b} in {c}")
            cells.append(difference_text(given[(a, b, c)]))
        if any(x != "-" for x in cells):
            lines.append(row([f"{a} − {b}", *cells]))
    if not lines:
        return []
    return ["Paired differences (x100; estimate [interval]):", "",
            row(["difference", *(headers[c] for c in columns)]), "|---" * (len(columns) + 1) + "|", *lines]


def coda_table(coda: Mapping, models: Sequence[Mapping]) -> list[str]:
    columns = list(CODA_COLUMNS)
    names = [m["name"] for m in models]
    unknown = set(coda["rows"]) - set(names)
    if unknown:
        raise ValueError(f"coda: rows {sorted(unknown)} are not in `models`")
    ns = {c: column_n(coda, c, names, "coda") for c in columns}
    out = [f"## CoDa ({coda['n_objects']} test objects)", "",
           "Per object, the Spearman (and Kendall) correlation of a row's colour scores with the human "
           "distribution under the object's best template (an upper bound), averaged over objects: under CoDa's own "
           "text-masked templates, and under ViComTe's 9 CoDa templates with the object's singular as the subject "
           "(\"Most duck are [MASK] .\"), the protocol of ViComTe's published figure.", "",
           row(["model", "role", *(CODA_COLUMNS[c] for c in columns)]), "|---" * (len(columns) + 2) + "|",
           row(["*n*", "", *(str(ns[c]) if ns[c] is not None else "-" for c in columns)]),
           row(["*class prior (train objects' mean distribution)*", "", *(pct(coda["majority"][c.split(".")[-1]]) for c in columns)])]
    for m in models:
        figures = {c: figure(coda, c, m["name"]) for c in columns}
        if all(f is None for f in figures.values()):
            continue
        out.append(row([m["name"], ROLE_TEXT[m["role"]], *(cell(figures[c]) for c in columns)]))
        out += [anchor_row(a, columns) for a in ANCHORS if a[0] == m["role"] and a[1] == "coda"]
    return out + [""] + differences_table(coda, columns, CODA_COLUMNS, models, "coda")


# ----------------------------------------------------------------------------------------------------
# The published anchors: do the reference row and CLIP-T reproduce them?
# ----------------------------------------------------------------------------------------------------

def anchor_checks(results: Mapping, role: str) -> list[tuple[str, float, float | None, float | None]]:
    """Per published figure of `role`'s row: (what, published x100, ours x100 or None, standard error x100
    or None). The standard error of an accuracy is the binomial one, sqrt(p (1 - p) / n) at the published
    p and our n; of a mean Spearman, the per-subject rhos' standard deviation / sqrt(n) (`spearman_se`)."""
    name = next((m["name"] for m in results["models"] if m["role"] == role), None)
    out = []
    for a_role, relation, grouping, column, value, _, _ in ANCHORS:
        if a_role != role:
            continue
        what = f"{relation}{'' if grouping is None else ', ' + GROUPING_TEXT[grouping]}, {column}"
        if relation == "coda":
            entry_set = results.get("coda")
        else:
            entry_set = results.get("vicomte", {}).get(relation, {}).get("groupings", {}).get(grouping)
        f = None if name is None or entry_set is None else figure(entry_set, column, name)
        if f is None:
            out.append((what, value, None, None))
            continue
        ours, n, _ = f
        if column.endswith("accuracy"):
            p = value / 100
            se = math.sqrt(p * (1 - p) / n)
        else:
            se = entry_of(entry_set, column, name).get("spearman_se", math.nan)
        out.append((what, value, 100 * ours, 100 * se))
    return out


def anchor_line(results: Mapping, role: str, label: str) -> str:
    """One line: whether `role`'s row reproduces its published figures within NOISE_SE standard errors."""
    checks = anchor_checks(results, role)
    run = [c for c in checks if c[2] is not None]
    if not run:
        return f"- {label}: no row, the published figures are not checked."
    outside = [c for c in run if not abs(c[2] - c[1]) <= NOISE_SE * c[3]]
    detail = "; ".join(f"{w}: ours {o:.1f}, published {v:.1f} (SE {se:.1f})" for w, v, o, se in run)
    missing = len(checks) - len(run)
    tail = f" ({missing} not run)" if missing else ""
    if outside:
        return (f"- {label}: does NOT reproduce {len(outside)} of {len(run)} published figures within {NOISE_SE} "
                f"standard errors{tail}. {detail}.")
    return f"- {label}: reproduces all {len(run)} published figures within {NOISE_SE} standard errors{tail}. {detail}."


# ----------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------

def merged_lines(merged: Mapping) -> list[str]:
    listed = [f"- {model}, {relation}: " + "; ".join("{" + ", ".join(g) + "}" for g in groups)
              for model, per_relation in merged.items() for relation, groups in per_relation.items() if groups]
    if not listed:
        return ["No two classes share a first sub-word in any vocabulary the cloze uses."]
    return ["The cloze cannot tell these classes apart (their words share a first sub-word in the row's "
            "vocabulary; a shared token gives them the same evidence, and a tie counts as top-1 for each):", "",
            *listed]


def render(results: Mapping) -> str:
    """reports/probes.md from the results dict described in the module docstring."""
    models = check_models(results["models"])
    boot = results["bootstrap"]
    out = [header("Visual-knowledge probes: ViComTe and CoDa", results["profile"], ", ".join(m["name"] for m in models)),
           "Figures x100. Linear probe (ViComTe's): per template, LogisticRegression(C=0.316) on the mean token "
           "state (CLIP-T: its text features) of the text with [X] filled, fit on train, scored on test; accuracy, "
           "and Spearman's ρ of the class probabilities against the subject's Visual Genome counts over the classes "
           "seen in training. **Oracle**: the best template on test, as the authors report (it reads the test "
           f"labels). **Chosen on train**: the best template in {results['cv_folds']}-fold cross-validation on train (`probes.cv_folds`). Cloze (MLM rows "
           "whose head was trained on the encoder's own output): top-1 correct where any template ranks the class "
           "first; ρ per subject under its best template. <sub>tK</sub>: the template a figure comes from. The linear "
           "columns leave out a test subject whose class train lacks (the authors' script does), the cloze columns keep "
           "it; *n* and the majority line (ρ: the train class counts as the prediction) are each column's own subjects'. "
           "The label is the file's `obj`, also where the counts tie it with another class.",
           "",
           f"Paired differences: the mean over the same test subjects of row a minus row b, with a "
           f"{100 * boot['level']:g}% percentile interval from {boot['n_boot']} bootstrap resamples of the subjects "
           f"(both rows on each resample). Every XD row against its family's baseline and caption-text control.",
           "",
           f"Published figures are {PROVENANCE}.",
           ""]
    vicomte = results.get("vicomte", {})
    for relation in vicomte:  # the file's order is not the report's (write_json sorts keys)
        if relation not in RELATIONS:
            raise ValueError(f"unknown ViComTe relation {relation!r}; allowed: {', '.join(RELATIONS)}")
        for grouping in vicomte[relation]["groupings"]:
            if grouping not in GROUPINGS:
                why = " (never shape's \"any\": 2 test subjects)" if grouping == "any" else ""
                raise ValueError(f"vicomte.{relation}: unknown grouping {grouping!r}; allowed: {', '.join(GROUPINGS)}{why}")
    for relation in (r for r in RELATIONS if r in vicomte):
        out += [f"## ViComTe: {relation}", ""]
        groupings = vicomte[relation]["groupings"]
        for grouping in (g for g in GROUPINGS if g in groupings):
            out += grouping_table(relation, grouping, groupings[grouping], models) + [""]
        out += ["Templates: " + "; ".join(f"t{i} `{t}`" for i, t in enumerate(vicomte[relation]["templates"])), ""]
    if "coda" in results:
        out += coda_table(results["coda"], models) + [""]
    out += ["## Reproduction", "",
            anchor_line(results, "reference", "Reference row (bert-base-cased)"),
            anchor_line(results, "clip", "CLIP-T"), "",
            "## Merged classes", "", *merged_lines(results.get("merged_classes", {}))]
    return "\n".join(out).rstrip("\n") + "\n"
