"""The probes study of issue 56 (../shared/PROBES.md): every row (xdbert.analysis.probe_rows) on ViComTe's relations
and CoDa, and the results dict that xdbert.reports.probes renders.

`probe` loads the rows one at a time and runs ViComTe's linear probe on each and, where a row has its own MLM head,
the cloze and CoDa (xdbert.analysis.vicomte_probe's math); then the paired bootstrap of every comparison the report
shows (`comparisons`) in every column where both rows have per-subject results. The entry builders (`linear_entry`,
`scores_entry`, `coda_entry`, `difference_entry`) turn vicomte_probe's results into the dict's pieces. Figures are
fractions (0-1 for accuracy, -1-1 for rank correlations); the report prints them x100.

Cost: each row's features are computed once per relation and template, for every subject of both groupings; the
probes of one (row, relation, grouping) fit their templates in parallel (`vicomte_probe.linear_probe`'s `n_jobs`),
and `probes.cv_folds` and `probes.n_boot` set the work of the template chosen on train and of the intervals.

The results dict (JSON):

    {
      "profile": "paper",
      "bootstrap": {"n_boot": 1000, "level": 0.95},
      "cv_folds": 5,                         # the cross-validation on train that chooses a template
      "models": [{"name": "XDBERT-b", "role": "xd", "family": "bert-b"}, ...],
          role: "baseline" (a family's MLM-only encoder), "xd" (an adapted encoder: Table 1's and
          Table 3's), "caption_control" (the family's encoder after the baseline's MLM recipe on COCO
          captions), "reference" (bert-base-cased), "clip" (CLIP-T). family: the family an "xd" row is
          compared within (its "baseline" and "caption_control" rows have the same); null for the
          reference and CLIP-T.
      "vicomte": {
        "<relation>": {                      # color, shape, material
          "templates": ["[X] can be of color [Y] .", ...],
          "groupings": {
            "<grouping>": {                  # all, single (never shape's "any": 2 test subjects)
              "n_test": 574,
              "majority": {                  # probe_stats.majority_line: each kind of column's line on its items
                "linear": {"class": "white", "accuracy": 0.375, "n": 573, "prior_spearman": 0.41},
                    # the test subjects whose class train holds; the prior over the classes seen in train
                "zero_shot": {"class": "white", "accuracy": 0.374, "n": 574, "prior_spearman": 0.40}},
                    # every test subject; the prior over all classes
              "linear": {"<model>": linear_entry(LinearProbe)},
              "zero_shot": {"<model>": scores_entry(Scores)},         # MLM rows only; may be empty
              "differences": [difference_entry(a, b, column, Interval), ...]
                  # column: linear.oracle.accuracy, linear.chosen.accuracy, linear.oracle.spearman,
                  # linear.chosen.spearman, zero_shot.accuracy, zero_shot.spearman
            }
          }
        }
      },
      "coda": {                              # optional
        "n_objects": 107,
        "majority": {"spearman": 0.5, "kendall": 0.4},   # every object scored by the train objects' mean distribution
        "rows": {"<model>": {**coda_entry(rho, tau),      # CoDa's own text-masked templates (the hub's texts)
                             "vicomte": coda_entry(rho, tau)}},  # ViComTe's protocol: its CoDa templates
        "differences": [difference_entry(a, b, column, Interval), ...]   # column: a key of CODA_COLUMNS
      },
      "merged_classes": {"<model>": {"<relation>": [["gray", "grey"], ...]}}   # vicomte_probe.merged_classes
                                                                              # of each cloze row; relation
                                                                              # "coda" for CoDa's colours
    }

Every "xd" row is compared with its family's "baseline" and, where the family has one, its
"caption_control", in every column where both rows have a figure; xdbert.reports.probes's `render`
refuses a results dict that lacks one of those differences. Rows of one column must have the same n (the same subjects).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from xdbert.analysis import probe_stats as S
from xdbert.analysis import vicomte_probe as V
from xdbert.analysis.mechanism_stats import Interval
from xdbert.analysis.probe_rows import BATCH_SIZE, Loaded, Row
from xdbert.data.coda import COLORS
from xdbert.errors import PipelineError

LEVEL = 0.95         # the paired bootstrap's interval
CODA_MASK = "[MASK]"  # in every text of CoDa's text-masked templates (xdbert.hub_layouts)
ROLES = ("baseline", "xd", "caption_control", "reference", "clip")

# column key -> its header in the report
VICOMTE_COLUMNS = {
    "linear.oracle.accuracy": "linear acc., oracle",
    "linear.chosen.accuracy": "linear acc., chosen on train",
    "linear.oracle.spearman": "linear ρ, oracle",
    "linear.chosen.spearman": "linear ρ, chosen on train",
    "zero_shot.accuracy": "cloze top-1",
    "zero_shot.spearman": "cloze ρ",
}
CODA_COLUMNS = {"coda.spearman": "Spearman ρ", "coda.kendall": "Kendall τ",
                "coda.vicomte.spearman": "Spearman ρ, ViComTe's templates"}


# ----------------------------------------------------------------------------------------------------
# The results dict's pieces
# ----------------------------------------------------------------------------------------------------

def linear_entry(probe: V.LinearProbe) -> dict:
    """A row's linear probe: per template choice ("oracle", "chosen") and metric the figure and its template."""
    out = {"n": probe.test[0].n, "n_spearman": probe.test[0].n_spearman}
    for choice in V.CHOICES:
        out[choice] = {}
        for metric in V.METRICS:
            t = probe.oracle(metric) if choice == "oracle" else probe.chosen(metric)
            scores = probe.test[t]
            out[choice][metric] = scores.accuracy if metric == "accuracy" else scores.mean_spearman
            out[choice][f"{metric}_template"] = t
    return out


def scores_entry(scores: V.Scores) -> dict:
    """A row's cloze: top-1 accuracy and mean Spearman (per subject the best template), with n and the
    Spearman's standard error (for the anchors' noise)."""
    return {"accuracy": scores.accuracy, "spearman": scores.mean_spearman, "spearman_se": scores.spearman_se,
            "n": scores.n, "n_spearman": scores.n_spearman}


def coda_entry(rho: np.ndarray, tau: np.ndarray) -> dict:
    """A row's CoDa figures from `probe_stats.coda_correlations`: the means over the objects that have
    them, n, and the Spearman's standard error (for the anchor's noise)."""
    rho, tau = np.asarray(rho, dtype=np.float64), np.asarray(tau, dtype=np.float64)
    kept = np.isfinite(rho)
    if kept.sum() < 2 or not np.array_equal(kept, np.isfinite(tau)):
        raise ValueError("CoDa needs rho and tau on the same objects, at least two")
    return {"spearman": float(rho[kept].mean()), "kendall": float(tau[kept].mean()),
            "spearman_se": float(rho[kept].std(ddof=1) / np.sqrt(kept.sum())), "n": int(kept.sum())}


def difference_entry(a: str, b: str, column: str, interval: Interval) -> dict:
    if column not in VICOMTE_COLUMNS and column not in CODA_COLUMNS:
        raise ValueError(f"unknown column {column!r}; allowed: {', '.join([*VICOMTE_COLUMNS, *CODA_COLUMNS])}")
    return {"a": a, "b": b, "column": column, "estimate": interval.estimate, "low": interval.low,
            "high": interval.high}


def comparisons(models: Sequence[Mapping]) -> list[tuple[str, str]]:
    """The differences the report shows, (a, b) for a minus b: every "xd" row minus its family's
    "baseline", then minus its family's "caption_control" where the family has one. ValueError where an
    "xd" row's family has no baseline."""
    by_role: dict[tuple[str, str | None], str] = {}
    for m in check_models(models):
        if m["role"] in ("baseline", "caption_control"):
            by_role[(m["role"], m.get("family"))] = m["name"]
    out = []
    for m in models:
        if m["role"] != "xd":
            continue
        baseline = by_role.get(("baseline", m.get("family")))
        if baseline is None:
            raise ValueError(f"the XD row {m['name']!r} has no baseline row of its family {m.get('family')!r}")
        out.append((m["name"], baseline))
        control = by_role.get(("caption_control", m.get("family")))
        if control is not None:
            out.append((m["name"], control))
    return out


def check_models(models: Sequence[Mapping]) -> Sequence[Mapping]:
    names = [m["name"] for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names repeat: {names}")
    for m in models:
        if m["role"] not in ROLES:
            raise ValueError(f"model {m['name']!r} has role {m['role']!r}; allowed: {', '.join(ROLES)}")
    for role in ("baseline", "caption_control", "reference", "clip"):
        keys = [m.get("family") for m in models if m["role"] == role]
        if len(set(keys)) != len(keys):
            raise ValueError(f"two {role} rows of one family: {keys}")
    return models


# ----------------------------------------------------------------------------------------------------
# The study: every row on every relation, grouping and template, then CoDa and the differences
# ----------------------------------------------------------------------------------------------------

def subjects_of(relation) -> list[str]:
    """Every subject of both groupings and splits, each once, in file order: one forward pass serves all probes."""
    return list(dict.fromkeys(e.sub for group in relation.splits.values() for split in group.values() for e in split))


def split_arrays(relation, group: str, split: str, index: Mapping[str, int]):
    """(subject rows into the features, classes, Visual Genome counts) of one split."""
    examples = relation.splits[group][split]
    return (np.array([index[e.sub] for e in examples]), np.array([relation.classes.index(e.obj) for e in examples]),
            np.array([relation.distributions[e.sub] for e in examples], dtype=np.float64))


def cloze_scores(loaded: Loaded, texts: Sequence[str], token_ids) -> "object":
    """Class scores at the mask of each text, (texts, classes)."""
    return V.mask_log_probs(loaded.mlm.encoder, loaded.mlm.head, loaded.tokenizer, texts, BATCH_SIZE, classes=token_ids)


def row_outputs(loaded: Loaded, relations: Mapping, coda_objects: Sequence, coda_templates: Sequence[str]) -> dict:
    """What a row's models give: per relation its probe features (templates of (subjects, d)) and, with an MLM
    head, its cloze scores (subjects, templates, classes) and merged classes; with one, CoDa's per-object scores
    under CoDa's text-masked templates ("coda") and under ViComTe's `coda_templates` ("coda_vicomte"), [X] the
    object's `ngram` (its singular where it has one: the protocol of ViComTe's published CoDa figure, which CoDa's
    own templates, with their plurals, do not reproduce)."""
    out = {"features": {}, "cloze": {}, "merged": {}, "coda": None, "coda_vicomte": None}
    for name, rel in relations.items():
        subjects = subjects_of(rel)
        out["features"][name] = [loaded.features(V.probe_texts(t, subjects)) for t in rel.templates]
        if loaded.mlm is not None:
            ids = V.class_token_ids(loaded.tokenizer, rel.synonyms)
            mask = loaded.tokenizer.mask_token
            out["cloze"][name] = np.stack([cloze_scores(loaded, V.cloze_texts(t, subjects, mask), ids)
                                           for t in rel.templates], axis=1)
            out["merged"][name] = V.merged_classes(loaded.tokenizer, rel.synonyms)
    if loaded.mlm is not None and coda_objects:
        words = {c: [c] for c in COLORS}
        ids = V.class_token_ids(loaded.tokenizer, words)
        mask = loaded.tokenizer.mask_token
        out["coda"] = [cloze_scores(loaded, [t.replace(CODA_MASK, mask) for t in texts], ids) for _, texts in coda_objects]
        out["coda_vicomte"] = [cloze_scores(loaded, [V.fill(t, first.ngram, mask) for t in coda_templates], ids)
                               for first, _ in coda_objects]
        out["merged"]["coda"] = V.merged_classes(loaded.tokenizer, words)
    return out


def coda_test_objects(coda: Mapping) -> list[tuple["object", list[str]]]:
    """CoDa's test objects, in file order: (the object's first row, the texts of its text-masked templates)."""
    objects: dict[str, list] = {}
    for r in coda["test"]:
        if r.template_group == "text-masked":
            objects.setdefault(r.class_id, [r, []])[1].append(r.text)
    return [(first, texts) for first, texts in objects.values()]


def paired(a, b, seed: int, n_boot: int):
    """The paired bootstrap of a minus b over the subjects where both have a result."""
    both = np.isfinite(a) & np.isfinite(b)
    return S.paired_bootstrap(np.where(both, a, np.nan), np.where(both, b, np.nan), n_boot=n_boot, level=LEVEL, seed=seed)


def differences(models: Sequence[dict], per_subject: Mapping[str, Mapping[str, "object"]], n_boot: int) -> list[dict]:
    """Every comparison the report shows (`comparisons`) in every column where both rows have per-subject results."""
    out = []
    for a, b in comparisons(models):
        for column, values in per_subject.items():
            if a in values and b in values:
                out.append(difference_entry(a, b, column, paired(values[a], values[b], V.PROBE_SEED, n_boot)))
    return out


def check_folds(relations: Mapping, cv_folds: int) -> None:
    """Every train split has at least `cv_folds` examples: the template chosen on train needs one per fold. Checked
    before any row loads, so that a short file stops the stage at once and not after hours of forward passes."""
    for name, rel in relations.items():
        for group, splits in rel.splits.items():
            if len(splits["train"]) < cv_folds:
                raise PipelineError(f"ViComTe's {name} {group}/train has {len(splits['train'])} examples, fewer than the "
                                    f"{cv_folds} folds of `probes.cv_folds`: give the whole split, or set probes.cv_folds "
                                    f"between 2 and {max(2, len(splits['train']))}")


def probe(rows: Sequence[Row], load: Callable[[Row], Loaded], relations: Mapping, coda: Mapping,
          coda_templates: Sequence[str], *, cv_folds: int, n_boot: int, jobs: int,
          say: Callable[[str], None] = lambda line: None) -> dict:
    """The results dict (the module docstring) for `rows`, each loaded by `load` one at a time; `relations`
    ViComTe's (xdbert.data.vicomte.load_relation), `coda` CoDa's splits (xdbert.data.coda), `coda_templates`
    ViComTe's templates for CoDa (xdbert.data.vicomte.load_coda_templates).
    A row's features are probed as soon as they are computed and then dropped: one row's in memory at a time."""
    check_folds(relations, cv_folds)
    models = [r.entry() for r in rows]
    coda_objects = coda_test_objects(coda)
    vicomte, per_subject, splits = {}, {}, {}
    for name, rel in relations.items():
        index = {sub: i for i, sub in enumerate(subjects_of(rel))}
        vicomte[name] = {"templates": list(rel.templates), "groupings": {}}
        for group in rel.splits:
            train, test = split_arrays(rel, group, "train", index), split_arrays(rel, group, "test", index)
            splits[name, group] = train, test
            (_, train_y, _), (_, test_y, test_dist) = train, test
            lines = {kind: S.majority_line(kind, train_y, test_y, test_dist) for kind in S.PROBE_KINDS}
            vicomte[name]["groupings"][group] = {
                "n_test": len(test_y), "linear": {}, "zero_shot": {},
                "majority": {kind: {**line, "class": rel.classes[line["class"]]} for kind, line in lines.items()}}
            per_subject[name, group] = {c: {} for c in VICOMTE_COLUMNS}
    merged, coda_scores = {}, {}
    for r in rows:
        out = row_outputs(load(r), relations, coda_objects, coda_templates)
        for (name, group), ((train_i, train_y, train_dist), (test_i, test_y, test_dist)) in splits.items():
            g, values = vicomte[name]["groupings"][group], per_subject[name, group]
            feats = out["features"][name]
            lp = V.linear_probe([f[train_i] for f in feats], train_y, train_dist, [f[test_i] for f in feats], test_y,
                                test_dist, n_folds=cv_folds, seed=V.PROBE_SEED, n_jobs=jobs)
            g["linear"][r.name] = linear_entry(lp)
            for choice in V.CHOICES:
                for metric in V.METRICS:
                    values[f"linear.{choice}.{metric}"][r.name] = lp.per_subject(choice, metric)
            if name in out["cloze"]:
                scores = V.zero_shot(out["cloze"][name][test_i], test_y, test_dist)
                g["zero_shot"][r.name] = scores_entry(scores)
                values["zero_shot.accuracy"][r.name], values["zero_shot.spearman"][r.name] = scores.correct, scores.spearman
        if out["merged"]:
            merged[r.name] = out["merged"]
        if out["coda"] is not None:
            coda_scores[r.name] = out["coda"], out["coda_vicomte"]
        say(f"probes: {r.name}: linear probe" + (", cloze and CoDa" if out["cloze"] else ""))
    for (name, group), values in per_subject.items():
        vicomte[name]["groupings"][group]["differences"] = differences(models, values, n_boot)
    results = {"bootstrap": {"n_boot": n_boot, "level": LEVEL}, "cv_folds": cv_folds, "models": models,
               "vicomte": vicomte, "merged_classes": merged}
    if coda_scores:
        results["coda"] = coda_results(coda, coda_objects, coda_scores, models, n_boot)
    return results


def coda_results(coda: Mapping, objects: Sequence, scores: Mapping[str, tuple[list, list]], models: Sequence[dict],
                 n_boot: int) -> dict:
    """CoDa's entry of the results dict: per cloze row its per-object correlations under CoDa's templates and under
    ViComTe's (`scores`: row -> both), the train prior, the differences."""
    human = np.array([first.label for first, _ in objects], dtype=np.float64)
    train = {r.class_id: r.label for r in coda["train"]}  # one distribution per object, whichever its template
    prior = np.tile(np.mean(list(train.values()), axis=0), (len(human), 1))
    rows, per_subject = {}, {c: {} for c in CODA_COLUMNS}
    for name, (own, vicomte) in scores.items():
        rho, tau = S.coda_correlations(own, human)
        v_rho, v_tau = S.coda_correlations(vicomte, human)
        rows[name] = {**coda_entry(rho, tau), "vicomte": coda_entry(v_rho, v_tau)}
        per_subject["coda.spearman"][name], per_subject["coda.kendall"][name] = rho, tau
        per_subject["coda.vicomte.spearman"][name] = v_rho
    return {"n_objects": len(objects), "rows": rows,
            "majority": {"spearman": V.finite_mean(V.spearman_rows(human, prior)), "kendall": V.finite_mean(V.kendall_rows(human, prior))},
            "differences": differences(models, per_subject, n_boot)}
