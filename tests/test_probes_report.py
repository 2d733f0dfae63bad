"""reports/probes.md (xdbert/reports/probes.py) on a made-up results dict built the way the probes study
(xdbert/analysis/probes.py) builds it: per-subject results -> vicomte_probe's Scores and LinearProbe -> the
study's entry builders, and every difference `comparisons` asks for from `paired_bootstrap`."""
import copy
import re

import numpy as np
import pytest

from xdbert.analysis import probes as S
from xdbert.analysis import probe_stats as PS
from xdbert.analysis import vicomte_probe as V
from xdbert.reports import probes as P

MODELS = [
    {"name": "BERT-b", "role": "baseline", "family": "bert-b"},
    {"name": "XDBERT-b", "role": "xd", "family": "bert-b"},
    {"name": "mlm", "role": "xd", "family": "bert-b"},                       # a Table 3 variant
    {"name": "BERT-b captions", "role": "caption_control", "family": "bert-b"},
    {"name": "ELECTRA-b", "role": "baseline", "family": "electra-b"},
    {"name": "XDELECTRA-b", "role": "xd", "family": "electra-b"},
    {"name": "bert-base-cased", "role": "reference", "family": None},
    {"name": "CLIP-T", "role": "clip", "family": None},
]
CLOZE_ROWS = ["BERT-b", "ELECTRA-b", "bert-base-cased"]  # MLM heads trained on their own encoder's output
SIZES = {("color", "all"): 574, ("color", "single"): 252, ("shape", "all"): 140, ("shape", "single"): 101,
         ("material", "all"): 284, ("material", "single"): 192}
BOOT = dict(n_boot=50, level=0.95, seed=0)


def scores(rng, n, rate, rho, unseen=()):
    correct = (rng.random(n) < rate).astype(float)
    spearman = np.clip(rho + 0.2 * rng.standard_normal(n), -1, 1)
    correct[list(unseen)] = np.nan
    spearman[list(unseen)] = np.nan
    return V.Scores(correct, spearman)


def grouping(rng, relation, group):
    n = SIZES[(relation, group)]
    unseen = (0, 1)  # two test subjects of a class never in train: out of every linear row
    probes = {m["name"]: V.LinearProbe([scores(rng, n, 0.5 + 0.1 * t, 0.3, unseen) for t in range(3)],
                                       cv_accuracy=rng.random(3), cv_spearman=rng.random(3)) for m in MODELS}
    cloze = {name: scores(rng, n, 0.4, 0.45) for name in CLOZE_ROWS}
    differences = []
    for a, b in S.comparisons(MODELS):
        for choice in V.CHOICES:
            for metric in V.METRICS:
                iv = PS.paired_bootstrap(probes[a].per_subject(choice, metric), probes[b].per_subject(choice, metric), **BOOT)
                differences.append(S.difference_entry(a, b, f"linear.{choice}.{metric}", iv))
        if a in cloze and b in cloze:
            raise AssertionError("no XD row has a cloze")
    return {"n_test": n,
            # each line on its column's subjects: the linear probe's leave out the two of the unseen class
            "majority": {"linear": {"class": "white", "accuracy": 0.38, "n": n - len(unseen), "prior_spearman": 0.31},
                         "zero_shot": {"class": "white", "accuracy": 0.375, "n": n, "prior_spearman": 0.29}},
            "linear": {name: S.linear_entry(p) for name, p in probes.items()},
            "zero_shot": {name: S.scores_entry(s) for name, s in cloze.items()},
            "differences": differences}


def coda(rng):
    n = 107
    # per row (rho, tau) under CoDa's templates, then (rho, tau) under ViComTe's
    rows = {m["name"]: [np.clip(mean + 0.2 * rng.standard_normal(n), -1, 1) for mean in (0.4, 0.3, 0.45, 0.35)]
            for m in MODELS}
    differences = [S.difference_entry(a, b, column, PS.paired_bootstrap(rows[a][i], rows[b][i], **BOOT))
                   for a, b in S.comparisons(MODELS)
                   for i, column in ((0, "coda.spearman"), (1, "coda.kendall"), (2, "coda.vicomte.spearman"))]
    return {"n_objects": n, "majority": {"spearman": 0.35, "kendall": 0.25},
            "rows": {name: {**S.coda_entry(*r[:2]), "vicomte": S.coda_entry(*r[2:])} for name, r in rows.items()},
            "differences": differences}


@pytest.fixture(scope="module")
def results():
    rng = np.random.default_rng(0)
    vicomte = {rel: {"templates": [f"[X] can be of {rel} [Y] .", f"[X] has {rel} [Y] .", "[Y] [X] ."],
                     "groupings": {g: grouping(rng, rel, g) for g in ("all", "single")}}
               for rel in ("color", "shape", "material")}
    return {"profile": "paper", "bootstrap": {"n_boot": BOOT["n_boot"], "level": BOOT["level"]}, "cv_folds": 5, "models": MODELS,
            "vicomte": vicomte, "coda": coda(rng),
            "merged_classes": {"bert-base-cased": {"color": []}, "BERT-b": {"color": [], "material": [["cotton", "denim"]]}}}


def tables(markdown):
    """Each '### ' or '## CoDa' section's first table: (title, header cells, rows of cells)."""
    out = []
    for section in re.split(r"\n(?=##+ )", markdown):
        title = section.splitlines()[0]
        lines = [l for l in section.splitlines() if l.startswith("|")]
        if not lines:
            continue
        head = [c.strip() for c in lines[0].strip("|").split("|")]
        body = []
        for l in lines[2:]:
            if l.startswith("|---"):
                break
            cells = [c.strip() for c in l.strip("|").split("|")]
            if cells[0] == "difference":
                break
            body.append(cells)
        out.append((title, head, body))
    return out


def test_every_model_row_and_column_with_n_and_the_majority_line(results):
    md = P.render(results)
    found = tables(md)
    vicomte = [t for t in found if t[0].startswith("### ")]
    assert [t[0] for t in vicomte] == [f"### {r}, {g} groups ({SIZES[(r, k)]} test subjects)".replace("single groups", "single group")
                                       for r in ("color", "shape", "material") for k, g in (("all", "all"), ("single", "single"))]
    for title, head, body in vicomte:
        assert head == ["model", "role", "linear acc., oracle", "linear acc., chosen on train", "linear ρ, oracle",
                        "linear ρ, chosen on train", "cloze top-1", "cloze ρ"]
        n = int(re.search(r"\((\d+) test", title).group(1))
        assert body[0] == ["*n*", "", str(n - 2), str(n - 2), str(n - 2), str(n - 2), str(n), str(n)]
        # the linear columns' line on their n - 2 subjects, the cloze's on all n
        assert body[1] == ["*majority class (white); ρ: class prior; each on its column's subjects*", "",
                           "38.0", "38.0", "31.0", "31.0", "37.5", "29.0"]
        rows = {cells[0]: cells for cells in body if not cells[0].startswith("*")}
        assert list(rows) == [m["name"] for m in MODELS]
        for name, cells in rows.items():
            assert all(re.fullmatch(r"-?\d+\.\d <sub>t\d</sub>", c) for c in cells[2:6]), cells
            cloze = cells[6:]
            assert all(re.fullmatch(r"-?\d+\.\d", c) for c in cloze) if name in CLOZE_ROWS else cloze == ["-", "-"]
    title, head, body = next(t for t in found if t[0].startswith("## CoDa"))
    assert head == ["model", "role", "Spearman ρ", "Kendall τ", "Spearman ρ, ViComTe's templates"]
    assert body[0] == ["*n*", "", "107", "107", "107"]
    assert body[1][2:] == ["35.0", "25.0", "35.0"] and [c[0] for c in body if not c[0].startswith("*")] == [m["name"] for m in MODELS]


def test_the_report_reads_the_same_after_a_json_round_trip(results):
    """The stage writes the results with xdbert.io.write_json: sorted keys, no NaN."""
    import json

    back = json.loads(json.dumps(results, sort_keys=True, allow_nan=False))
    assert P.render(back) == P.render(results)
    assert P.render(back).index("## ViComTe: shape") < P.render(back).index("## ViComTe: material")


def test_the_figures_are_the_oracle_and_the_chosen_templates(results):
    g = results["vicomte"]["color"]["groupings"]["all"]
    entry = g["linear"]["XDBERT-b"]
    row = next(l for l in P.render(results).split("### color, all groups")[1].splitlines() if l.startswith("| XDBERT-b |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{100 * entry['oracle']['accuracy']:.1f} <sub>t{entry['oracle']['accuracy_template']}</sub>"
    assert cells[3] == f"{100 * entry['chosen']['accuracy']:.1f} <sub>t{entry['chosen']['accuracy_template']}</sub>"
    assert cells[5] == f"{100 * entry['chosen']['spearman']:.1f} <sub>t{entry['chosen']['spearman_template']}</sub>"
    assert "**Oracle**: the best template on test" in P.render(results)


def test_linear_entry_reads_the_templates_each_choice_picks():
    good, bad = V.Scores(np.array([1.0, 1.0, np.nan]), np.array([0.9, 0.7, np.nan])), V.Scores(np.array([0.0, 1.0, np.nan]), np.array([0.1, 0.2, np.nan]))
    probe = V.LinearProbe([bad, good], cv_accuracy=np.array([0.8, 0.2]), cv_spearman=np.array([0.1, 0.6]))
    e = S.linear_entry(probe)
    assert e["n"] == 2 and e["n_spearman"] == 2
    assert e["oracle"] == {"accuracy": 1.0, "accuracy_template": 1, "spearman": pytest.approx(0.8), "spearman_template": 1}
    assert e["chosen"] == {"accuracy": 0.5, "accuracy_template": 0, "spearman": pytest.approx(0.8), "spearman_template": 1}


def test_every_xd_difference_against_baseline_and_caption_control(results):
    assert S.comparisons(MODELS) == [("XDBERT-b", "BERT-b"), ("XDBERT-b", "BERT-b captions"), ("mlm", "BERT-b"),
                                     ("mlm", "BERT-b captions"), ("XDELECTRA-b", "ELECTRA-b")]
    md = P.render(results)
    for section in md.split("### ")[1:]:
        lines = section.split("Paired differences")[1].splitlines()
        diffs = {l.split("|")[1].strip(): [c.strip() for c in l.strip("|").split("|")[1:]] for l in lines if "−" in l}
        assert list(diffs) == [f"{a} − {b}" for a, b in S.comparisons(MODELS)]
        for cells in diffs.values():  # every linear column has an interval; no XD row has a cloze
            assert all(re.fullmatch(r"[+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\]", c) for c in cells[:4]) and cells[4:] == ["-", "-"]
    broken = copy.deepcopy(results)
    broken["vicomte"]["shape"]["groupings"]["single"]["differences"].pop(3)
    with pytest.raises(ValueError, match="lack the difference XDBERT-b - BERT-b in linear.chosen.spearman"):
        P.render(broken)
    broken = copy.deepcopy(results)
    broken["coda"]["differences"] = [d for d in broken["coda"]["differences"] if d["b"] != "BERT-b captions"]
    with pytest.raises(ValueError, match="coda: the results lack the difference XDBERT-b - BERT-b captions"):
        P.render(broken)
    with pytest.raises(ValueError, match="no baseline row of its family"):
        S.comparisons([{"name": "XDX", "role": "xd", "family": "x"}])


def test_the_published_anchors_sit_under_their_rows_with_their_provenance(results):
    md = P.render(results)
    color_single = md.split("### color, single group")[1].split("### ")[0]
    lines = [l for l in color_single.splitlines() if l.startswith("|")]
    at = [i for i, l in enumerate(lines) if l.startswith("| bert-base-cased |")][0]
    assert lines[at + 1].startswith("| *published, from the authors' repository, not checked against the paper: bert-base-cased")
    assert [c.strip() for c in lines[at + 1].strip("|").split("|")][2:] == ["*54.8*", "", "", "", "", ""]
    clip = [i for i, l in enumerate(lines) if l.startswith("| CLIP-T |")][0]
    assert "CLIP ViT-B/32 text" in lines[clip + 1]
    assert [c.strip() for c in lines[clip + 1].strip("|").split("|")][2:] == ["*66.3*", "", "", "", "", ""]
    color_all = md.split("### color, all groups")[1].split("### ")[0]
    assert "*47.5*" in color_all and "*55.8*" in color_all and "*53.7*" in color_all
    assert "*55.8*" not in color_single and "*53.7*" not in color_single  # the rows we lack: all groups only
    assert "*54.8*" not in color_all  # the single-group figure only beside the single-group table
    # ViComTe's CoDa figure beside the column computed with its protocol (its templates, the singular subject)
    coda_lines = [l for l in md.split("## CoDa")[1].splitlines() if l.startswith("|")]
    at = [i for i, l in enumerate(coda_lines) if l.startswith("| bert-base-cased |")][0]
    assert "its 9 templates" in coda_lines[at + 1]
    assert [c.strip() for c in coda_lines[at + 1].strip("|").split("|")][2:] == ["", "", "*46.2*"]
    assert "ViComTe's 9 CoDa templates with the object's singular as the subject" in md


def with_reference(results, off=0.0):
    """The results with the reference row's anchored figures set near the published ones (+ `off`)."""
    r = copy.deepcopy(results)
    for role, relation, grouping, column, value, _, _ in P.ANCHORS:
        if role != "reference":
            continue
        if relation == "coda":
            r["coda"]["rows"]["bert-base-cased"]["vicomte"].update(spearman=value / 100 + off, spearman_se=0.02)
        elif column.startswith("linear"):
            r["vicomte"][relation]["groupings"][grouping]["linear"]["bert-base-cased"]["oracle"]["accuracy"] = value / 100 + off
        else:
            r["vicomte"][relation]["groupings"][grouping]["zero_shot"]["bert-base-cased"].update(spearman=value / 100 + off, spearman_se=0.01)
    return r


def test_the_reproduction_line_reads_the_binomial_noise(results):
    near = with_reference(results, off=0.01)
    checks = {what: rest for what, *rest in P.anchor_checks(near, "reference")}
    published, ours, se = checks["color, single group, linear.oracle.accuracy"]
    assert (published, ours, se) == (54.8, pytest.approx(55.8), pytest.approx(100 * np.sqrt(0.548 * 0.452 / 250)))
    assert checks["coda, coda.vicomte.spearman"] == [46.2, pytest.approx(47.2), pytest.approx(2.0)]  # the rows' spearman_se
    line = next(l for l in P.render(near).splitlines() if l.startswith("- Reference row"))
    assert "reproduces all 5 published figures within 2 standard errors" in line
    assert "color, single group, linear.oracle.accuracy: ours 55.8, published 54.8 (SE 3.1)" in line  # sqrt(.548 .452 / 250)
    # 7 points off: outside 2 binomial SEs for colour (2 SE 6.3, n 250), inside for material (7.3, n 190) and
    # shape (7.5, n 99); outside for both Spearman figures (2 SE 2 and 4)
    line = next(l for l in P.render(with_reference(results, off=0.07)).splitlines() if l.startswith("- Reference row"))
    assert "does NOT reproduce 3 of 5 published figures" in line
    assert "material, single group, linear.oracle.accuracy: ours 58.6, published 51.6 (SE 3.6)" in line
    clip = next(l for l in P.render(results).splitlines() if l.startswith("- CLIP-T"))
    assert "3 published figures" in clip
    no_reference = copy.deepcopy(results)
    no_reference["models"] = [m for m in MODELS if m["role"] != "reference"]
    for rel in no_reference["vicomte"].values():
        for g in rel["groupings"].values():
            g["linear"].pop("bert-base-cased")
            g["zero_shot"].pop("bert-base-cased")
    no_reference["coda"]["rows"].pop("bert-base-cased")
    assert "- Reference row (bert-base-cased): no row, the published figures are not checked." in P.render(no_reference)


def test_merged_classes_are_listed(results):
    md = P.render(results)
    assert "- BERT-b, material: {cotton, denim}" in md and "bert-base-cased, color" not in md
    clean = {**results, "merged_classes": {"bert-base-cased": {"color": []}}}
    assert "No two classes share a first sub-word in any vocabulary the cloze uses." in P.render(clean)


def test_refused_results(results):
    bad = copy.deepcopy(results)
    bad["vicomte"]["shape"]["groupings"]["any"] = bad["vicomte"]["shape"]["groupings"]["single"]
    with pytest.raises(ValueError, match="never shape's \"any\""):
        P.render(bad)
    bad = copy.deepcopy(results)
    bad["vicomte"]["color"]["groupings"]["all"]["linear"]["CLIP-T"]["n"] = 570
    with pytest.raises(ValueError, match="different n"):
        P.render(bad)
    bad = copy.deepcopy(results)  # a majority line on all test subjects beside a column that scores fewer
    bad["vicomte"]["shape"]["groupings"]["all"]["majority"]["linear"]["n"] = 140
    with pytest.raises(ValueError, match=r"shape.all, linear.oracle.accuracy: the majority line is on 140 subjects and "
                                         r"the column on 138; a line must be on the subjects its column scores"):
        P.render(bad)
    bad = copy.deepcopy(results)
    bad["vicomte"]["color"]["groupings"]["all"]["zero_shot"]["GPT"] = bad["vicomte"]["color"]["groupings"]["all"]["zero_shot"]["BERT-b"]
    with pytest.raises(ValueError, match=r"rows \['GPT'\] are not in `models`"):
        P.render(bad)
    with pytest.raises(ValueError, match="role 'teacher'"):
        P.render({**results, "models": [*MODELS, {"name": "T", "role": "teacher", "family": None}]})
