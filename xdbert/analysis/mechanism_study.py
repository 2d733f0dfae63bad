"""The mechanism study (issue 55, issue 68; ../shared/MECHANISM.md): every number of reports/mechanism.md from the
models, tasks and finetuning predictions the pipeline wrote. Stage `mechanism` (stages/mechanism.py) reads the
params into a `Plan`, checks its inputs (`check_inputs`) and writes what `study` returns.

The calibration ladder comes first (M: the upper reference memorized the facts, xdbert/analysis/cloze.py; R: the
instrument reads facts an encoder holds; T: a loss from the tower alone can move them), then gates A-E; D is read only where M and R pass. The numbers:
xdbert/analysis/mechanism.py and mechanism_stats.py; the probe: xdbert/analysis/probe.py over
analysis/representations.py's features.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from xdbert import io
from xdbert import params as P
from xdbert.data.mechanism import (
    CAPTION_MLM, CAPTION_MLM_NOFACTS, DISTILL_COS, DISTILL_COS_NOFACTS, DISTILL_KL, DISTILL_KL_NOFACTS, NOFACTS, VIS,
    MechanismSettings,
)
from xdbert.errors import PipelineError
from xdbert.finetuning.control.runs import Run
from xdbert.data.captions import CAPTIONS_FILE, NOFACTS_FILE
from xdbert.paths import (
    ADAPT_METRICS, CAPTIONS, CORPUS, MODELS, PRETRAIN_CLIP, PRETRAIN_CLIP_NOFACTS, TASKS, TOKENIZER, VIS_KINDS, adapted, crossmodal,
    predictions, pretrain_encoder,
)

REPLICATIONS = Path("inputs/replications")  # gate D's runs on other facts: a dep of this stage, so a changed one reruns it
SWEEP = REPLICATIONS / "mechanism-sweep.json"  # the exploratory sweep's results (bench/mechanism_sweep.py), where run
CONTEXT_WINDOW = 5   # the corpus baseline's context: words within 5 of the object, where a stated fact would sit
TRANSFER = {DISTILL_KL: DISTILL_KL_NOFACTS, DISTILL_COS: DISTILL_COS_NOFACTS}  # rung T's controls and their twins
# the KL pair is rung T's own form (issue 68); the cosine pair is optional, read beside it where listed (`missing_rows`)
NEEDED = {CAPTION_MLM: "rungs M and R", CAPTION_MLM_NOFACTS: "rung R", DISTILL_KL: "rung T", DISTILL_KL_NOFACTS: "rung T",
          "clip_t": "gate A", "clip_nofacts_t": "gate A",
          "full_xdbert": "gate B", "full_nofacts": "gate B", "baseline": "rung M and gate C", P.PROPOSED: "gates D and E",
          NOFACTS: "gates D and E"}
CLOZED = (CAPTION_MLM, P.BASELINE)  # the models rung M asks with their own MLM head (their whole models: the head)
REFERENCES = {CAPTION_MLM: "real", CAPTION_MLM_NOFACTS: "twin"}  # the caption references and the table they read


def missing_rows(rows) -> list[str]:
    """The rows the gates need that `rows` lacks, each with the rung or gate that reads it: all of NEEDED, and
    both halves of any other pair of rung T's listed (a control without its twin has nothing to be read against)."""
    needed = dict(NEEDED)
    needed.update({m: "rung T" for pair in TRANSFER.items() if set(pair) & set(rows) for m in pair})
    return [f"{label} ({why})" for label, why in needed.items() if label not in rows]


def transfer_pairs(rows) -> dict[str, str]:
    """Rung T's controls among `rows`, each with its twin (`missing_rows` has checked that they come in pairs)."""
    return {a: b for a, b in TRANSFER.items() if a in rows}


class Plan(NamedTuple):
    """What `read` checked: the stage's whole plan."""

    profile: str
    s: MechanismSettings
    family: str                 # adapt.family: the encoders and whole models of the study
    tasks_seed: int             # the tasks stage's seed: the vis examples of each bag-of-words facts seed
    runs: dict[str, dict[str, Run]]  # vis and the control task -> row label -> run (empty when the study is off)
    tower_reads: tuple[int, int] | None  # the CLIP stand-ins' (steps, batch size); None: pretrained, not trained here
    reference_reads: tuple[int, float]   # the caption references' batch size and their attribute words' target rate


def model_folders(plan: Plan) -> dict[str, tuple[Path, str]]:
    """Every model the probe reads, by its probe row name: (its folder, the file a complete one has)."""
    from xdbert.model.files import CLIP_CONFIG, CROSSMODAL_CONFIG

    s, fam = plan.s, plan.family
    folders = {f"tower {t}": (MODELS / t, CLIP_CONFIG) for t in s.clip_towers}
    folders.update({f"tower after adaptation, {m}": (crossmodal(fam, m), CROSSMODAL_CONFIG) for m in (P.PROPOSED, NOFACTS)})
    folders.update({f"{m} with its MLM head": (crossmodal(fam, m), CROSSMODAL_CONFIG) for m in CLOZED})
    folders["pretrain_encoder"] = (pretrain_encoder(fam), "config.json")
    folders.update({m: (adapted(fam, m), "config.json") for m in s.models})
    return folders


def check_inputs(plan: Plan, control_split: str) -> None:
    """Every file the stage reads is there before any work: one PipelineError naming the first missing."""
    for name, (folder, marker) in model_folders(plan).items():
        if not (folder / marker).is_file():
            raise PipelineError(f"missing model folder {folder} (no {marker}) for the probe row `{name}`: run the stage "
                                f"that writes it (`dvc repro`)")
    files = [TOKENIZER / "tokenizer_config.json", CORPUS / "train.parquet",
             *(TASKS / VIS / f for f in ("train.parquet", "dev.parquet", VIS_KINDS)),
             TASKS / plan.s.control_task / f"{control_split}.parquet"]
    files += [predictions(task, r.name) for task, rows in plan.runs.items() for r in rows.values()]
    if plan.s.replication:
        if Path(plan.s.replication).parent != REPLICATIONS:
            raise PipelineError(f"`mechanism.replication` must name a file in {REPLICATIONS}/, the folder this stage "
                                f"depends on (so that a changed file reruns it), or be \"\"; got {plan.s.replication!r}")
        files.append(Path(plan.s.replication))
    files += [CAPTIONS / name for name in (CAPTIONS_FILE, NOFACTS_FILE)]
    files += [ADAPT_METRICS / plan.family / f"{m}.json" for m in REFERENCES]
    for f in files:
        if not f.is_file():
            raise PipelineError(f"missing file {f}: run the stage that writes it first (`dvc repro`)"
                                + (" or fix `mechanism.replication`" if str(f) == plan.s.replication else ""))


def replication_claim(path: str, seed: int):
    """Gate D's Claim on other facts (seed 1), from a results/mechanism.json this stage wrote; None where not run.
    A run on the study's own facts seed would replicate nothing: refused."""
    from xdbert.analysis.mechanism import claim_from_json

    if not path:
        return None
    try:
        result = io.read_json(path)
        claim, facts_seed = claim_from_json(result["claim"]), result["facts_seed"]
    except (KeyError, TypeError, ValueError) as e:
        raise PipelineError(f"`mechanism.replication`: {path} holds no claim of a mechanism stage run ({e!r}); name "
                            f"a results/mechanism.json of the study on facts seed 1, or \"\"") from None
    if facts_seed == seed:
        raise PipelineError(f"`mechanism.replication`: {path} is a run on facts seed {seed}, this study's own; D's "
                            f"replication needs the facts reassigned (`mechanism.seed: 1`), or \"\"")
    return claim


def read_sweep() -> dict | None:
    """The exploratory sweep's results (`SWEEP`), None where it was not run; a PipelineError for a file that is
    not one."""
    if not SWEEP.is_file():
        return None
    from xdbert.analysis.mechanism import sweep_markdown

    try:
        sweep = io.read_json(SWEEP)
        sweep_markdown(sweep)  # renders every cell: a file that lacks one, or holds a non-number, fails here
    except (KeyError, TypeError, ValueError) as e:
        raise PipelineError(f"{SWEEP} holds no results of bench/mechanism_sweep.py ({e!r}): rerun it and copy its "
                            f"bench/results/mechanism_sweep.json there, or remove the file") from None
    return sweep


def study(plan: Plan, control_split: str, replication, header) -> tuple[dict, str]:
    """(results/mechanism.json, reports/mechanism.md): every number of the study. `header(title, profile, rows,
    seeds)` writes the report's head (xdbert.reports.header, which the analyses do not import)."""
    import numpy as np
    from transformers import AutoModel

    from xdbert.analysis import cloze
    from xdbert.analysis import frozen_readout as F
    from xdbert.analysis import mechanism as M
    from xdbert.analysis import mechanism_stats as S
    from xdbert.analysis import power as W
    from xdbert.analysis import probe
    from xdbert.analysis.grounding import compare_models
    from xdbert.analysis.representations import (
        bag_of_words_predictions, context_counts, encoder_features, neutral_sentences, tower_features,
    )
    from xdbert.clip import clip_tokenizer
    from xdbert.data.synthetic.world import vis_examples
    from xdbert.data.tasks.registry import get_task
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.data.tokenization.word_ids import single_ids
    from xdbert.finetuning.control.predictions import RERUN, read_predictions
    from xdbert.model.saving import load_clip_tower, load_full

    s, g, seed = plan.s, plan.s.gates, plan.s.seed
    pairs = transfer_pairs(s.models)  # rung T's controls listed, each with its twin
    facts = s.facts()
    attributes = list(facts.attributes)
    objects = facts.captioned()
    classes = np.array([attributes.index(facts.real[o.sing]) for o in objects])
    words = [o.sing for o in objects]
    frames = neutral_sentences(s.sentences)

    # The representation probe: towers before and after adaptation, every encoder, the corpus baseline. Its null:
    # the fact table re-drawn by draw_facts with other seeds (probe.null_seeds), once for every row
    try:
        null_classes = probe.redrawn_classes(lambda k: s.facts(k).real, words, attributes,
                                             probe.null_seeds(g["n_perm"]), seed)
    except ValueError as e:
        raise PipelineError(f"`mechanism.seed`: {e}") from None

    def probed(features):
        return M.probe_row(features, classes, null_classes, len(attributes), g["lambda"])

    probes, tok_name = {}, None
    for tower in s.clip_towers:
        t, cfg = load_clip_tower(MODELS / tower)
        tok_name = cfg["clip"]
        probes[f"tower {tower}"] = probed(tower_features(t, clip_tokenizer(tok_name), words, frames))
    for m in (P.PROPOSED, NOFACTS):
        full = load_full(crossmodal(plan.family, m))
        probes[f"tower after adaptation, {m}"] = probed(tower_features(full.clip, clip_tokenizer(tok_name), words, frames))
    tok = load_encoder_tokenizer(str(TOKENIZER))
    for name in ("pretrain_encoder", *s.models):
        folder = pretrain_encoder(plan.family) if name == "pretrain_encoder" else adapted(plan.family, name)
        probes[name] = probed(encoder_features(AutoModel.from_pretrained(str(folder)), tok, words, frames))
    corpus = io.read_parquet(CORPUS / "train.parquet", "run `dvc repro corpus`").column("text").to_pylist()
    sentences = [x for doc in corpus for x in re.split(r"(?<=[.!?])\s+", doc) if x]
    probes["corpus (context words)"] = probed([context_counts(sentences, objects, CONTEXT_WINDOW)])
    at = {name: M.probe_at(rows, g["probe_layer"]) for name, rows in probes.items()}

    def flip_p(a, b):  # the probe's paired one-sided sign-flip test over objects, a above b
        return probe.sign_flip_p(np.array(at[a]["correct"]), np.array(at[b]["correct"]), g["n_flip"], seed)

    # The cells: every row on vis (by kind) and on the control task
    kinds_table = io.read_parquet(TASKS / VIS / VIS_KINDS, "run `dvc repro tasks`").to_pandas()
    kinds_table = kinds_table.sort_values("idx")
    idx = kinds_table["idx"].to_numpy()
    kinds, owners = kinds_table["kind"].to_numpy(), kinds_table["object"].to_numpy()
    dev = io.read_parquet(TASKS / VIS / "dev.parquet", "run `dvc repro tasks`").to_pandas().set_index("idx")
    control_dev = io.read_parquet(TASKS / s.control_task / f"{control_split}.parquet", "run `dvc repro tasks`")
    correct, preds = {}, {}
    for label, r in plan.runs[VIS].items():
        try:
            preds[label] = read_predictions(predictions(VIS, r.name))
            vis = M.correct_matrix(preds[label], "dev", idx)[1]
            on_control = predictions(s.control_task, plan.runs[s.control_task][label].name)
            control = M.correct_matrix(read_predictions(on_control), control_split)[1]
        except ValueError as e:
            raise PipelineError(f"{e}; {RERUN}") from None
        correct[label] = (vis, control)
    rows = {label: M.cells(vis, owners, kinds, control, g, seed) for label, (vis, control) in correct.items()}
    n = M.units(owners, kinds, next(iter(correct.values()))[1].shape[1])
    labels = dev.loc[idx, "label"].to_numpy().astype(int)
    chance = {**M.majority(labels, kinds, len(attributes)),
              **M.majority(np.asarray(control_dev.column("label").to_pylist(), dtype=int), None,
                           get_task(s.control_task).num_labels)}

    def diff(a, b, kind):
        on_vis = kind is not None
        return M.difference(correct[a][0 if on_vis else 1], correct[b][0 if on_vis else 1],
                            owners if on_vis else None, kinds if on_vis else None, kind, g, seed)

    # The frozen readout (issue 68, item 4): logistic regression on each vis sentence's object-word last-layer state,
    # fitted on the train objects' sentences, scored on dev: what an encoder holds, with no finetuning to hide or
    # create a fact
    vis_train = io.read_parquet(TASKS / VIS / "train.parquet", "run `dvc repro tasks`").to_pandas()
    readout_rows = (list(zip(vis_train["text_a"], vis_train["label"].astype(int))),
                    list(zip(dev.loc[idx, "text_a"], dev.loc[idx, "label"].astype(int))))
    readout = {m: F.frozen_readout(AutoModel.from_pretrained(str(adapted(plan.family, m))), tok, *readout_rows,
                                   facts.objects) for m in s.models}
    readout_cells = {m: S.cell(r, owners, kinds, "F+", n_boot=g["n_boot"], level=g["level"], exact_below=g["exact_below"],
                               seed=seed) for m, r in readout.items()}
    readout_diffs = {f"{a} - {b}": M.difference(readout[a], readout[b], owners, kinds, "F+", g, seed)
                     for a, b in ((CAPTION_MLM, CAPTION_MLM_NOFACTS), *pairs.items(), (P.PROPOSED, NOFACTS))}

    # The bag-of-words row: F+ pooled over facts seeds, each with its own vis examples
    right = total = 0
    for bow_seed in s.bow_seeds:
        examples, meta = vis_examples(s.facts(bow_seed), n_train=s.vis["train"], n_f_plus=s.vis["f_plus"],
                                      n_f_zero=s.vis["f_zero"], n_t=s.vis["t"], seed=plan.tasks_seed)
        guess = bag_of_words_predictions([(r[0], r[3]) for r in examples["train"]], [r[0] for r in examples["dev"]],
                                         len(attributes), g["lambda"])
        f_plus = np.array([m["kind"] == "F+" for m in meta])
        gold = np.array([r[3] for r in examples["dev"]])
        right += int((guess == gold)[f_plus].sum())
        total += int(f_plus.sum())
    bow_accuracy, bow_p = M.bag_of_words(right, total, len(attributes))
    bow = {"seeds": list(s.bow_seeds), "accuracy": bow_accuracy, "p": bow_p, "right": right, "total": total,
           "null": "one-sided binomial against chance 1/attributes"}

    # Gate E: XDBERT against nofacts, example by example, on the F examples
    is_f = np.isin(kinds, ("F+", "F0"))
    f_idx = set(idx[is_f].tolist())
    keep = lambda df: df[(df["split"] == "dev") & df["idx"].isin(f_idx)]  # noqa: E731
    change = compare_models(keep(preds[NOFACTS]), keep(preds[P.PROPOSED]), (NOFACTS, P.PROPOSED))
    counts = M.gate_e_counts(change, dict(zip(idx.tolist(), kinds.tolist())))

    # The calibration ladder (issue 68), before any gate: M, the upper reference asked its facts at a [MASK] in
    # frames no caption uses, against the twin's table; R, it beside its twin on vis F+ and on the probe; T, the
    # tower distilled into the encoder beside the twin tower distilled the same way
    twin = np.array([attributes.index(facts.twin[o.sing]) for o in objects])
    try:  # a vocabulary that cuts the attribute words into pieces (the micro profile's) has no one-token cloze
        single_ids(tok, attributes, "attribute word")
        unreadable = None
    except ValueError as e:
        unreadable = str(e)
    answers = {} if unreadable else {
        m: cloze.cloze_answers(load_full(crossmodal(plan.family, m)), tok, words, attributes) for m in CLOZED}
    memory = {m: cloze.memorized(x, classes, twin, g["level"], g["n_flip"], seed) for m, x in answers.items()}
    transfer = {a: (diff(a, b, "F+"), at[a]["accuracy"] - at[b]["accuracy"], flip_p(a, b)) for a, b in pairs.items()}
    ladder = [S.Gate("M", S.FAIL, f"not read: {unreadable}") if unreadable else
              S.rung_m(memory[CAPTION_MLM], memory[P.BASELINE], g),
              S.rung_r(diff(CAPTION_MLM, CAPTION_MLM_NOFACTS, "F+"),
                       at[CAPTION_MLM]["accuracy"] - at[CAPTION_MLM_NOFACTS]["accuracy"], flip_p(CAPTION_MLM, CAPTION_MLM_NOFACTS), g),
              S.rung_t(transfer, g)]

    claim = S.Claim(diff(P.PROPOSED, NOFACTS, "F+"), diff(P.PROPOSED, NOFACTS, "T="), diff(P.PROPOSED, NOFACTS, None),
                    flip_p(P.PROPOSED, NOFACTS))
    # Power (issue 68, item 5): the smallest F+ gain each clause detects at 80% power, at the study's objects and
    # seeds, planted into the model's wrong answers and read through the same interval
    def power_of(a, b):
        return W.difference_power(correct[a][0], correct[b][0], owners, kinds, "F+", g, seed)

    power = {"M": W.memorized_power(answers[CAPTION_MLM], classes, twin, g["level"], g["n_flip"], seed)} if answers else {}
    read_t = S.stronger_form(transfer)
    power |= {"R": power_of(CAPTION_MLM, CAPTION_MLM_NOFACTS), "T": power_of(read_t, pairs[read_t]),
              "D": power_of(P.PROPOSED, NOFACTS)}
    ladder = [with_power(r, power) for r in ladder]

    tower = at[f"tower {PRETRAIN_CLIP.name}"]
    gates = [S.gate_a(diff("clip_t", "clip_nofacts_t", "F+"), tower["accuracy"], tower["p"], g),
             S.gate_b(diff("full_xdbert", "full_nofacts", "F+")),
             S.gate_c({"corpus": (at["corpus (context words)"]["accuracy"], at["corpus (context words)"]["p"]),
                       "baseline": (at["baseline"]["accuracy"], at["baseline"]["p"]),
                       "pretrain_encoder": (at["pretrain_encoder"]["accuracy"], at["pretrain_encoder"]["p"]),
                       "bag-of-words": (bow_accuracy, bow_p)}, g),
             with_power(S.gate_d(claim, replication, g, S.failed_rung(ladder)), power),
             S.gate_e(*counts, g)]
    # the caption control reads the facts directly: whether even it shows them tells what a null D means
    reference = diff(CAPTION_MLM, P.BASELINE, "F+") if CAPTION_MLM in correct else None

    exposure = exposures_per_fact(plan, facts, words)

    sweep = read_sweep()
    settings = {"facts seed (`mechanism.seed`)": s.seed, "gates (`mechanism.gates`)": ", ".join(f"{k} {v}" for k, v in g.items()),
                "probe objects": f"{len(objects)} captioned (train + dev_captioned), {s.sentences} neutral sentences",
                "probe null": f"{g['n_perm']} fact tables re-drawn by draw_facts, seeds {probe.NULL_SEEDS_FROM}-"
                              f"{probe.NULL_SEEDS_FROM + g['n_perm'] - 1}",
                "corpus baseline": f"context-word counts within {CONTEXT_WINDOW} words over {CORPUS}/train.parquet",
                "bag-of-words null": "one-sided binomial against chance 1/attributes, F+ pooled over the facts seeds",
                "gate E": "improved / worsened per F example (F+, F0) as grounding.compare_models counts them, "
                          "tested by kind alone: no grounded-word ratio is computed, so attribute words enter no "
                          "grounded-word set",
                "replication (`mechanism.replication`)": s.replication or "not run",
                "exploratory sweep": f"{SWEEP} (facts seeds {', '.join(map(str, sweep['seeds']))})" if sweep else "not run"}
    result = {"profile": plan.profile, "enabled": True, "facts_seed": s.seed, "thresholds": dict(g),
              "summary": S.summary(gates, reference),
              **({"upper_reference": M.interval_json(reference)} if reference else {}),
              "ladder": M.records_json(ladder), "gates": M.records_json(gates), "exposures": exposure,
              "power": {name: W.power_json(p) for name, p in power.items()},
              "frozen_readout": {"position": F.POSITION, "C": F.C, "f_plus": {m: M.interval_json(i) for m, i in readout_cells.items()},
                                 "differences": {k: M.interval_json(i) for k, i in readout_diffs.items()}},
              "memorized": {m: {**r, "difference": M.interval_json(r["difference"])} for m, r in memory.items()},
              "claim": M.claim_json(claim), "gate_e": dict(zip(("improved_f_plus", "improved_f0", "worsened_f_plus",
                                                                 "worsened_f0"), counts)),
              "cells": {label: {c: M.interval_json(i) for c, i in r.items()} for label, r in rows.items()},
              "n": n, "chance": chance, "bag_of_words": bow,
              "probe": {name: {"probe_layer": at[name]["layer"], "layers": rows_} for name, rows_ in probes.items()}}
    seeds = sorted({int(x) for x in preds[P.PROPOSED]["seed"].unique()})
    head = header("The mechanism study: do CLIP's facts reach the encoder?", plan.profile,
                  ", ".join(plan.runs[VIS]), ", ".join(map(str, seeds))) + f"\n{S.summary(gates, reference)}\n"
    shown = {name: {k: v for k, v in r.items() if k != "correct"} for name, r in at.items()}
    notes = {CAPTION_MLM: "upper reference: MLM on the captions that state the facts, beside corpus windows",
             CAPTION_MLM_NOFACTS: "its twin: the same on the twin's captions",
             DISTILL_KL: "rung T: corpus MLM, masked words pulled (KL) towards the tower's next token",
             DISTILL_KL_NOFACTS: "the same beside the twin tower",
             DISTILL_COS: "rung T: corpus MLM, each token's state mapped onto the tower's (1 - cosine)",
             DISTILL_COS_NOFACTS: "the same beside the twin tower"}
    return result, M.report_markdown(head, ladder, gates, rows, n, chance, bow, shown, settings, s.control_task, notes,
                                     reference, exposure, W.null_reading(claim.f_plus, power["D"]), (readout_cells, readout_diffs),
                                     sweep)


def with_power(record, power: dict):
    """A rung's or D's record with its clause's power figure after its numbers (`power` by record name)."""
    import dataclasses

    from xdbert.analysis import power as W

    if record.name not in power:
        return record
    return dataclasses.replace(record, numbers=f"{record.numbers}; {W.power_text(power[record.name])}")


def exposures_per_fact(plan: Plan, facts, objects: list[str]) -> dict[str, dict]:
    """Each caption-reading model's exposures per captioned object's fact (xdbert.analysis.exposures): the two CLIP
    stand-ins (next-token targets after the object) and the two caption references (masked targets); the encoders
    the study adapts read no caption."""
    from xdbert.analysis import exposures as X
    from xdbert.data.provided import read_coco_captions

    captions = {"real": read_coco_captions(CAPTIONS / CAPTIONS_FILE), "twin": read_coco_captions(CAPTIONS / NOFACTS_FILE)}
    out = {}
    if plan.tower_reads is not None:
        steps, batch = plan.tower_reads
        for tower, table in ((PRETRAIN_CLIP.name, "real"), (PRETRAIN_CLIP_NOFACTS.name, "twin")):
            seen = X.passes(steps, batch, plan.s.caption_share, len(captions[table]))
            counts = X.statements(captions[table], objects, getattr(facts, table), after_only=True)
            out[f"tower {tower}"] = {**X.summary(counts * seen), "target": "next token, attribute after the object"}
    batch, rate = plan.reference_reads
    for m, table in REFERENCES.items():
        metrics = io.read_json(ADAPT_METRICS / plan.family / f"{m}.json")
        seen = X.passes(metrics["steps"], batch, 1.0, metrics["train_windows"])  # every window as often
        counts = X.statements(captions[table], objects, getattr(facts, table), after_only=False)
        out[m] = {**X.summary(counts * seen * rate), "target": f"masked attribute word (rate {rate:g})"}
    return out
