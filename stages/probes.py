"""Stage `probes`: the visual-knowledge probes of issue 56 (../shared/PROBES.md), ViComTe and CoDa, on every encoder.

    deps:   models/adapted (every Table 1 and Table 3 encoder, the caption-text control), models/crossmodal (the MLM
            heads of the baselines and the caption control), models/pretrain_clip (CLIP-T), models/tokenizer, inputs/vicomte;
            CoDa and the reference encoder through the pins of hub.lock.json
    outs:   reports/probes.md, results/probes.json (metrics)

Rows: each family's MLM baseline and XDBERT (Table 1), the variants of `adapt.family` (Table 3), CLIP-T (its text
features), the `probes.reference` encoder from its pinned hub snapshot, and the caption-text control (the variant
CAPTION_CONTROL, where `adapt.variants` has it). ViComTe's linear probe runs on every row; the zero-shot cloze and
CoDa only on rows whose MLM head was trained on that encoder's own output and saved: the reference (its hub head),
the baselines and a caption control without cross layers (their heads in models/crossmodal). Never XDBERT or a
Table 3 variant: their head read the cross layers' output, not the encoder's.

Cost: each row's features are computed once per relation and template, for every subject of both groupings; the
probes of one (row, relation, grouping) fit their templates in parallel (`vicomte_probe.linear_probe`'s `n_jobs`),
and `probes.cv_folds` and `probes.n_boot` set the work of the template chosen on train and of the intervals.

With `probes.enabled: false` (the embedded and micro profiles) it writes a short report saying the probes are off,
and nothing else, as the mechanism stage does when its study is off.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

from xdbert import io
from xdbert import params as P
from xdbert.data.probes import ProbesSettings
from xdbert.errors import PipelineError
from xdbert.model.settings import ablation_family, family_names
from xdbert.paths import CLIP_CONFIG, CROSSMODAL_CONFIG, PRETRAIN_CLIP, PROBES_METRICS, TOKENIZER, adapted, crossmodal, report
from xdbert.stage import run

CAPTION_CONTROL = "caption_mlm"  # the adapt variant of the caption-text control (the baseline's MLM recipe on captions)
CLIP_ROW = "clip_t"
LEVEL = 0.95                     # the paired bootstrap's interval
BATCH_SIZE = 32                  # texts per forward pass; the features do not depend on it
TITLE = "Visual-knowledge probes: ViComTe and CoDa"


class Row(NamedTuple):
    """One row of the report: where its encoder is, and where its MLM head is (None: no cloze)."""

    name: str
    role: str                  # xdbert.reports.probes.ROLES
    family: str | None
    kind: str                  # "encoder" (an adapted folder), "clip" (a CLIP tower folder), "hub" (a hub id)
    source: str                # the folder or the hub id
    head: str | None = None    # "hub" (the hub model's own), a models/crossmodal folder, or None

    def entry(self) -> dict:
        return {"name": self.name, "role": self.role, "family": self.family}


class Plan(NamedTuple):
    profile: str
    s: ProbesSettings
    rows: list[Row]            # empty when the probes are off


def read(p: dict) -> Plan:
    """Every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    s = ProbesSettings.from_params(p)
    if not s.enabled:
        return Plan(p["profile"], s, [])
    fam = ablation_family(p).name
    variants = P.variant_names(p)
    rows = []
    for f in family_names(p):
        rows += [Row(f"{f}/{P.BASELINE}", "baseline", f, "encoder", str(adapted(f, P.BASELINE)), own_head(p, f, P.BASELINE)),
                 Row(f"{f}/{P.PROPOSED}", "xd", f, "encoder", str(adapted(f, P.PROPOSED)))]
    rows += [Row(f"{fam}/{v}", "xd", fam, "encoder", str(adapted(fam, v))) for v in variants if v != CAPTION_CONTROL]
    if CAPTION_CONTROL in variants:
        rows.append(Row(f"{fam}/{CAPTION_CONTROL}", "caption_control", fam, "encoder", str(adapted(fam, CAPTION_CONTROL)),
                        own_head(p, fam, CAPTION_CONTROL)))
    rows += [Row(CLIP_ROW, "clip", None, "clip", str(PRETRAIN_CLIP)), Row(s.reference, "reference", None, "hub", s.reference, "hub")]
    return Plan(p["profile"], s, rows)


def own_head(p: dict, family: str, variant: str) -> str | None:
    """The models/crossmodal folder of `variant`'s MLM head where that head read the encoder's own output (no cross
    layers: the baseline's recipe), else None (no cloze)."""
    from xdbert.adaptation.settings import variant_overrides

    overrides, _ = variant_overrides(p, variant)
    cross_layers = overrides.get("cross_layers", P.get(P.section(p, "adapt"), "cross_layers", "adapt"))
    return str(crossmodal(family, variant)) if cross_layers == 0 else None


def check_inputs(plan: Plan) -> None:
    """Every model folder the stage reads is there before any work: one PipelineError naming the first missing."""
    for r in plan.rows:
        needed = [] if r.kind == "hub" else [(Path(r.source), CLIP_CONFIG if r.kind == "clip" else "config.json")]
        if r.head not in (None, "hub"):
            needed.append((Path(r.head), CROSSMODAL_CONFIG))
        for folder, marker in needed:
            if not (folder / marker).is_file():
                raise PipelineError(f"missing model folder {folder} (no {marker}) for the probe row `{r.name}`: run the "
                                    f"stage that writes it (`dvc repro`)")
    if not (TOKENIZER / "tokenizer_config.json").is_file():
        raise PipelineError(f"missing {TOKENIZER}: run `dvc repro dual_tokenize`")


def main() -> None:
    plan = read(P.load())
    s = plan.s
    from xdbert.reports.header import header

    if not s.enabled:
        io.write_json(PROBES_METRICS, {"profile": plan.profile, "enabled": False})
        io.write_text(report("probes"), header(TITLE, plan.profile, "-")
                      + "\nThe probes are off (`probes.enabled: false`): no probe was run.\n")
        return
    from xdbert.data.coda import load_coda
    from xdbert.data.vicomte import load_relation
    from xdbert.reports.probes import render

    check_inputs(plan)
    relations = {r: load_relation(s.vicomte_dir, r) for r in s.relations}
    coda = load_coda(s.coda_hub_id)
    jobs = len(os.sched_getaffinity(0))
    results = probe(plan.rows, load_row, relations, coda, cv_folds=s.cv_folds, n_boot=s.n_boot, jobs=jobs,
                    say=lambda line: print(line, flush=True))
    results["profile"] = plan.profile
    io.write_json(PROBES_METRICS, results)
    io.write_text(report("probes"), render(results))


# ----------------------------------------------------------------------------------------------------
# Loading a row: its features and, where it has its own MLM head, its cloze
# ----------------------------------------------------------------------------------------------------

class EncoderHead(NamedTuple):
    """An MLM as `vicomte_probe.mask_log_probs` reads it: its encoder, and the head trained on that encoder's output
    (last_hidden_state -> vocabulary logits)."""

    encoder: object
    head: object


class Loaded(NamedTuple):
    """A row's models, loaded: `features(texts)` -> (texts, d); `mlm` and `tokenizer` for the cloze, or None."""

    features: Callable[[Sequence[str]], "object"]
    mlm: EncoderHead | None = None
    tokenizer: object | None = None


def hub_mlm(mlm, name: str) -> EncoderHead:
    """A transformers MLM (`AutoModelForMaskedLM`) as its encoder and the one module beside it, the head its forward
    applies to the encoder's output (BERT's `cls`, RoBERTa's `lm_head`)."""
    heads = [module for module in mlm.children() if module is not mlm.base_model]
    if len(heads) != 1:
        raise PipelineError(f"the probes' reference `{name}` ({type(mlm).__name__}) has {len(heads)} modules beside its "
                            f"encoder; the cloze reads an MLM whose head is one module (BERT, RoBERTa)")
    return EncoderHead(mlm.base_model, heads[0])


def load_row(row: Row) -> Loaded:
    """Row `row`'s models, as the other stages load them (hub ids through their pins: xdbert.hub), on the GPU
    where there is one."""
    from functools import partial

    import torch
    from transformers import AutoModel, AutoModelForMaskedLM

    from xdbert.analysis.vicomte_probe import clip_text_features, mean_token_features
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.hub import hub_request, quiet_loading, source

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if row.kind == "clip":
        from xdbert.clip import clip_tokenizer
        from xdbert.model.saving import load_clip_tower

        tower, cfg = load_clip_tower(row.source)
        return Loaded(partial(clip_text_features, tower.to(device), clip_tokenizer(cfg["clip"]), batch_size=BATCH_SIZE))
    if row.kind == "hub":
        tok = load_encoder_tokenizer(row.source)
        with hub_request(f"the probes' reference encoder `{row.source}`"), quiet_loading():
            mlm = AutoModelForMaskedLM.from_pretrained(source(row.source)).to(device)
        return Loaded(partial(mean_token_features, mlm.base_model, tok, batch_size=BATCH_SIZE), hub_mlm(mlm, row.source), tok)
    tok = load_encoder_tokenizer(str(TOKENIZER))
    if row.head is None:
        with quiet_loading():
            encoder = AutoModel.from_pretrained(row.source).to(device)
        return Loaded(partial(mean_token_features, encoder, tok, batch_size=BATCH_SIZE))
    from xdbert.model.saving import load_full

    full = load_full(row.head, device)  # its encoder is the adapted folder's, with the head it was trained with
    return Loaded(partial(mean_token_features, full.encoder, tok, batch_size=BATCH_SIZE),
                  EncoderHead(full.encoder, full.mlm_head), tok)


# ----------------------------------------------------------------------------------------------------
# The probes: every row on every relation, grouping and template, then CoDa and the differences
# ----------------------------------------------------------------------------------------------------

def subjects_of(relation) -> list[str]:
    """Every subject of both groupings and splits, each once, in file order: one forward pass serves all probes."""
    return list(dict.fromkeys(e.sub for group in relation.splits.values() for split in group.values() for e in split))


def split_arrays(relation, group: str, split: str, index: Mapping[str, int]):
    """(subject rows into the features, classes, Visual Genome counts) of one split."""
    import numpy as np

    examples = relation.splits[group][split]
    return (np.array([index[e.sub] for e in examples]), np.array([relation.classes.index(e.obj) for e in examples]),
            np.array([relation.distributions[e.sub] for e in examples], dtype=np.float64))


def cloze_scores(loaded: Loaded, texts: Sequence[str], token_ids) -> "object":
    """Class scores at the mask of each text, (texts, classes)."""
    from xdbert.analysis.vicomte_probe import mask_log_probs

    return mask_log_probs(loaded.mlm.encoder, loaded.mlm.head, loaded.tokenizer, texts, BATCH_SIZE, classes=token_ids)


def row_outputs(loaded: Loaded, relations: Mapping, coda_objects: Sequence) -> dict:
    """What a row's models give: per relation its probe features (templates of (subjects, d)) and, with an MLM
    head, its cloze scores (subjects, templates, classes) and merged classes; with one, CoDa's per-object scores."""
    import numpy as np

    from xdbert.analysis.vicomte_probe import class_token_ids, cloze_texts, merged_classes, probe_texts
    from xdbert.data.coda import COLORS

    out = {"features": {}, "cloze": {}, "merged": {}, "coda": None}
    for name, rel in relations.items():
        subjects = subjects_of(rel)
        out["features"][name] = [loaded.features(probe_texts(t, subjects)) for t in rel.templates]
        if loaded.mlm is not None:
            ids = class_token_ids(loaded.tokenizer, rel.synonyms)
            mask = loaded.tokenizer.mask_token
            out["cloze"][name] = np.stack([cloze_scores(loaded, cloze_texts(t, subjects, mask), ids)
                                           for t in rel.templates], axis=1)
            out["merged"][name] = merged_classes(loaded.tokenizer, rel.synonyms)
    if loaded.mlm is not None and coda_objects:
        words = {c: [c] for c in COLORS}
        ids = class_token_ids(loaded.tokenizer, words)
        mask = loaded.tokenizer.mask_token
        out["coda"] = [cloze_scores(loaded, [t.replace(CODA_MASK, mask) for t in texts], ids) for _, texts in coda_objects]
        out["merged"]["coda"] = merged_classes(loaded.tokenizer, words)
    return out


CODA_MASK = "[MASK]"  # in every text of CoDa's text-masked templates (xdbert.hub_layouts)


def coda_test_objects(coda: Mapping) -> list[tuple["object", list[str]]]:
    """CoDa's test objects, in file order: (the object's first row, the texts of its text-masked templates)."""
    objects: dict[str, list] = {}
    for r in coda["test"]:
        if r.template_group == "text-masked":
            objects.setdefault(r.class_id, [r, []])[1].append(r.text)
    return [(first, texts) for first, texts in objects.values()]


def paired(a, b, seed: int, n_boot: int):
    """The paired bootstrap of a minus b over the subjects where both have a result."""
    import numpy as np

    from xdbert.analysis.vicomte_probe import paired_bootstrap

    both = np.isfinite(a) & np.isfinite(b)
    return paired_bootstrap(np.where(both, a, np.nan), np.where(both, b, np.nan), n_boot=n_boot, level=LEVEL, seed=seed)


def differences(models: Sequence[dict], per_subject: Mapping[str, Mapping[str, "object"]], n_boot: int) -> list[dict]:
    """Every comparison the report shows (`comparisons`) in every column where both rows have per-subject results."""
    from xdbert.analysis.vicomte_probe import PROBE_SEED
    from xdbert.reports.probes import comparisons, difference_entry

    out = []
    for a, b in comparisons(models):
        for column, values in per_subject.items():
            if a in values and b in values:
                out.append(difference_entry(a, b, column, paired(values[a], values[b], PROBE_SEED, n_boot)))
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


def probe(rows: Sequence[Row], load: Callable[[Row], Loaded], relations: Mapping, coda: Mapping, *, cv_folds: int,
          n_boot: int, jobs: int, say: Callable[[str], None] = lambda line: None) -> dict:
    """The results dict of xdbert.reports.probes (its docstring) for `rows`, each loaded by `load` one at a
    time; `relations` ViComTe's (xdbert.data.vicomte.load_relation), `coda` CoDa's splits (xdbert.data.coda).
    A row's features are probed as soon as they are computed and then dropped: one row's in memory at a time."""
    import numpy as np

    from xdbert.analysis import vicomte_probe as V
    from xdbert.reports import probes as R

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
            majority, share = V.majority_class(test_y)
            counts = np.bincount(train_y, minlength=len(rel.classes)).astype(np.float64)
            vicomte[name]["groupings"][group] = {
                "n_test": len(test_y), "linear": {}, "zero_shot": {},
                "majority": {"class": rel.classes[majority], "accuracy": share,
                             "prior_spearman": V.finite_mean(V.prior_spearman(train_y, test_y, test_dist)),
                             "prior_spearman_all": V.finite_mean(V.spearman_rows(test_dist, np.tile(counts, (len(test_y), 1))))}}
            per_subject[name, group] = {c: {} for c in R.VICOMTE_COLUMNS}
    merged, coda_scores = {}, {}
    for r in rows:
        out = row_outputs(load(r), relations, coda_objects)
        for (name, group), ((train_i, train_y, train_dist), (test_i, test_y, test_dist)) in splits.items():
            g, values = vicomte[name]["groupings"][group], per_subject[name, group]
            feats = out["features"][name]
            lp = V.linear_probe([f[train_i] for f in feats], train_y, train_dist, [f[test_i] for f in feats], test_y,
                                test_dist, n_folds=cv_folds, seed=V.PROBE_SEED, n_jobs=jobs)
            g["linear"][r.name] = R.linear_entry(lp)
            for choice in V.CHOICES:
                for metric in V.METRICS:
                    values[f"linear.{choice}.{metric}"][r.name] = lp.per_subject(choice, metric)
            if name in out["cloze"]:
                scores = V.zero_shot(out["cloze"][name][test_i], test_y, test_dist)
                g["zero_shot"][r.name] = R.scores_entry(scores)
                values["zero_shot.accuracy"][r.name], values["zero_shot.spearman"][r.name] = scores.correct, scores.spearman
        if out["merged"]:
            merged[r.name] = out["merged"]
        if out["coda"] is not None:
            coda_scores[r.name] = out["coda"]
        say(f"probes: {r.name}: linear probe" + (", cloze and CoDa" if out["cloze"] else ""))
    for (name, group), values in per_subject.items():
        vicomte[name]["groupings"][group]["differences"] = differences(models, values, n_boot)
    results = {"bootstrap": {"n_boot": n_boot, "level": LEVEL}, "cv_folds": cv_folds, "models": models,
               "vicomte": vicomte, "merged_classes": merged}
    if coda_scores:
        results["coda"] = coda_results(coda, coda_objects, coda_scores, models, n_boot)
    return results


def coda_results(coda: Mapping, objects: Sequence, scores: Mapping[str, list], models: Sequence[dict], n_boot: int) -> dict:
    """CoDa's entry of the results dict: per cloze row its per-object correlations, the train prior, the differences."""
    import numpy as np

    from xdbert.analysis import vicomte_probe as V
    from xdbert.reports import probes as R

    human = np.array([first.label for first, _ in objects], dtype=np.float64)
    train = {r.class_id: r.label for r in coda["train"]}  # one distribution per object, whichever its template
    prior = np.tile(np.mean(list(train.values()), axis=0), (len(human), 1))
    rows, per_subject = {}, {c: {} for c in R.CODA_COLUMNS}
    for name, s in scores.items():
        rho, tau = V.coda_correlations(s, human)
        rows[name] = R.coda_entry(rho, tau)
        per_subject["coda.spearman"][name], per_subject["coda.kendall"][name] = rho, tau
    return {"n_objects": len(objects), "rows": rows,
            "majority": {"spearman": V.finite_mean(V.spearman_rows(human, prior)), "kendall": V.finite_mean(V.kendall_rows(human, prior))},
            "differences": differences(models, per_subject, n_boot)}


if __name__ == "__main__":
    run(main)
