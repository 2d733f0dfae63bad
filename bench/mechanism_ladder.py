"""The mechanism study's calibration on the tuning seed (issue 68, ../shared/MECHANISM.md "Calibration"): the
ladder's models and numbers in minutes, not a repro.

    python bench/mechanism_ladder.py --project DIR [--work DIR] [--set KEY=VALUE ...] [--name NAME]
                                     [--parts references,towers,transfer]

DIR is a project after an embedded `dvc repro`; it is only read: its token shards, tokenizer, `pretrain_encoder`
and baseline adaptation, none of which depends on the facts. In --work, with the embedded profile's params and
the --set overrides (dotted keys, JSON values: `--set mechanism.caption_frames=3`), the stages `captions`,
`ablate@caption_mlm` and `ablate@caption_mlm_nofacts` run as `dvc repro` runs them, then rung M reads the
upper reference, its twin and the baseline: each captioned object's fact asked with the model's own MLM head
(xdbert.analysis.cloze), in M's frames, which no caption uses, and in the captions' own frames beside them.

--parts picks what trains (default: references). `towers`: `pretrain_clip` (both CLIP stand-ins) in --work,
then gate A's probe of each tower and of the twin; without it the project's towers are linked (or the ones an
earlier `--parts towers` run left in --work are kept). `transfer`: rung T's controls beside those towers, each
beside its twin (`ablate@distill_kl`, `ablate@distill_cos` and their `_nofacts`), then the probe of each encoder.
The probes are the study's (xdbert.analysis.mechanism.probe_row at `gates.probe_layer`, paired sign-flip p).

The facts are the tuning seed's (100) unless a lever sets `mechanism.seed`; the study's seeds 0 and 1 are
refused, so development never reads them (issue 68). Writes bench/results/mechanism_ladder[_NAME].md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import xdbert  # noqa: F401, E402  (first: it fixes the CPU kernels and threads before torch and numpy load)
import numpy as np  # noqa: E402

STUDY_SEEDS = (0, 1)  # the study's facts and D's replication: never read before version 2 is committed
TUNING_SEED = 100     # the facts every lever is tried on
REFERENCES = ("caption_mlm", "caption_mlm_nofacts")
LINKED = ("data/shards", "data/corpus", "models/tokenizer", "models/pretrain_encoder", "hub.lock.json")
TOWERS = ("models/pretrain_clip", "models/pretrain_clip_nofacts")  # linked unless --parts has towers
TRANSFER = ("distill_kl", "distill_kl_nofacts", "distill_cos", "distill_cos_nofacts")  # rung T's pairs, real then twin
PARTS = ("references", "towers", "transfer")


def lever_params(items: list[str]) -> str:
    """The embedded profile's params.yaml text with each KEY=VALUE of `items` set (dotted key, JSON value; a bare
    word is a string), marked as the lever (`profiles.render`, as `xdbert profile` writes it)."""
    from xdbert import profiles

    changes = {}
    for item in items:
        key, _, text = item.partition("=")
        try:
            changes[tuple(key.split("."))] = json.loads(text)
        except json.JSONDecodeError:
            changes[tuple(key.split("."))] = text
    return profiles.render("embedded", changes, note="this run's lever")


def prepare(project: Path, work: Path, params_text: str, linked: tuple[str, ...] = LINKED) -> None:
    """The work folder: the params written, the project's fact-free inputs (`linked`) linked."""
    (work / "params.yaml").write_text(params_text, encoding="utf-8")
    for rel in linked:
        target, link = project / rel, work / rel
        if not target.exists():
            raise SystemExit(f"{target} is missing: run an embedded `dvc repro` in {project} first")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists() and not link.is_symlink():  # a folder an earlier run here trained (towers) is kept
            link.symlink_to(target.resolve())


def stage(work: Path, *args: str) -> float:
    """Run a stage script in `work` as `dvc repro` would; its seconds."""
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "stages" / args[0]), *args[1:]], cwd=work, env=env, check=True)
    return round(time.time() - t0, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True, help="a project after an embedded `dvc repro` (read only)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mechanism_ladder"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override (the lever)")
    ap.add_argument("--name", default="", help="the results' suffix (default: none)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--parts", default="references", help=f"what trains, comma-separated: {', '.join(PARTS)}")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if not parts or set(parts) - set(PARTS):
        raise SystemExit(f"--parts {args.parts!r}: a comma-separated list of {', '.join(PARTS)}")

    from provenance import code_version, describe
    from xdbert import io
    from xdbert.analysis import cloze
    from xdbert.analysis.mechanism_stats import fmt
    from xdbert.data.mechanism import MechanismSettings
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.model.saving import load_full
    from xdbert.params import read_yaml_text

    # the tuning seed unless a lever names one: params.yaml holds the study's seed once version 2 is committed
    levers = args.set if any(x.startswith("mechanism.seed=") for x in args.set) else [f"mechanism.seed={TUNING_SEED}", *args.set]
    params_text = lever_params(levers)
    params = read_yaml_text(params_text)
    m = MechanismSettings.from_params(params)
    if m.seed in STUDY_SEEDS:
        raise SystemExit(f"mechanism.seed {m.seed} is one of the study's seeds {STUDY_SEEDS}: calibrate on the tuning "
                         f"seed (100) alone until version 2's thresholds are committed")
    project, work = args.project.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    prepare(project, work, params_text, LINKED + (() if "towers" in parts else TOWERS))
    family = params["adapt"]["family"]
    seconds = {"captions": stage(work, "captions.py")}
    if "towers" in parts:
        seconds["pretrain_clip"] = stage(work, "pretrain_clip.py")
    for name in (REFERENCES if "references" in parts else ()) + (TRANSFER if "transfer" in parts else ()):
        seconds[name] = stage(work, "adapt.py", family, name)

    facts = m.facts()
    attributes = list(facts.attributes)
    objects = [o.sing for o in facts.captioned()]
    real = np.array([attributes.index(facts.real[o]) for o in objects])
    twin = np.array([attributes.index(facts.twin[o]) for o in objects])
    g = m.gates
    tok = load_encoder_tokenizer(str(work / "models" / "tokenizer"))
    read = REFERENCES if "references" in parts else ()
    models = {"baseline": project / "models" / "crossmodal" / family / "baseline",
              **{name: work / "models" / "crossmodal" / family / name for name in read}}
    frame_sets = {"M frames": cloze.CLOZE_FRAMES, "caption frames": cloze.caption_cloze_frames()}
    metrics = {"baseline": io.read_json(project / "metrics" / "adapt" / family / "baseline.json"),
               **{name: io.read_json(work / "metrics" / "adapt" / family / f"{name}.json")
                  for name in read + (TRANSFER if "transfer" in parts else ())}}
    rows = {}
    for name, folder in (models if read else {}).items():
        model = load_full(folder)
        rows[name] = {"corpus_mlm_accuracy": metrics[name]["valid_mlm_accuracy"],
                      "steps": metrics[name]["steps"], "train_windows": metrics[name]["train_windows"]}
        for label, frames in frame_sets.items():
            answers = cloze.cloze_answers(model, tok, objects, attributes, frames)
            # the twin reference is read against its own table too: it must hold the twin's facts as the real one holds its own
            rows[name][label] = cloze.memorized(answers, real, twin, g["level"], g["n_flip"], m.seed)
            if name == "caption_mlm_nofacts":
                rows[name][f"{label}, own table"] = cloze.memorized(answers, twin, real, g["level"], g["n_flip"], m.seed)

    probes = probe_rows(work, project, family, parts, m, facts)
    result = {**code_version(), "facts_seed": m.seed, "levers": args.set, "parts": parts, "seconds": seconds,
              "probes": probes, "corpus_mlm_accuracy": {k: v["valid_mlm_accuracy"] for k, v in metrics.items()},
              "objects": len(objects), "frames": {k: list(v) for k, v in frame_sets.items()},
              "models": {name: {k: ({**v, "difference": v["difference"]._asdict()} if isinstance(v, dict) else v)
                                for k, v in row.items()} for name, row in rows.items()}}
    stem = "mechanism_ladder" + (f"_{args.name}" if args.name else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Mechanism ladder: facts seed {m.seed}, levers {args.set or 'none'}, parts {', '.join(parts)}", "",
             describe(result), ""]
    if probes:
        lines += ["The study's representation probe of each object's state (left-out accuracy, chance 0.25; p against "
                  "its null; the pair's paired sign-flip p over objects, real above twin):", "",
                  "| pair | real | twin | real - twin | sign-flip p |", "|---|---|---|---|---|"]
        lines += [f"| {pair} | {r['real']['accuracy']:.2f} (p {r['real']['p']:.3f}) | {r['twin']['accuracy']:.2f} "
                  f"(p {r['twin']['p']:.3f}) | {r['real']['accuracy'] - r['twin']['accuracy']:+.2f} | {r['flip_p']:.4f} |"
                  for pair, r in probes.items()]
        lines.append("")
    if rows:
        lines += [f"Rung M. Each of the {len(objects)} captioned objects' fact asked at a [MASK] with the model's own MLM "
                  f"head, the four attribute words competing (chance 0.25). Real / twin: accuracy against each table; "
                  f"difference: real minus twin over objects, its {g['level']:.0%} sign-flip interval.", "",
                  "| model | corpus MLM acc | frames | real | twin | real - twin |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        for label in [k for k in row if isinstance(row[k], dict)]:
            r = row[label]
            lines.append(f"| {name} | {row['corpus_mlm_accuracy']:.3f} | {label} | {r['real_accuracy']:.2f} | "
                         f"{r['twin_accuracy']:.2f} | {fmt(r['difference'])} |")
    lines += ["", "Corpus MLM accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in result["corpus_mlm_accuracy"].items()),
              "", "Seconds: " + ", ".join(f"{k} {v}" for k, v in seconds.items()), ""]
    (args.out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def probe_rows(work: Path, project: Path, family: str, parts: list[str], m, facts) -> dict[str, dict]:
    """Gate A's probe of the two towers (with --parts towers) and rung T's of its two pairs (with transfer): each
    side's row at `gates.probe_layer` and the pair's paired sign-flip p, as the mechanism stage computes them."""
    from transformers import AutoModel

    from xdbert.analysis import probe
    from xdbert.analysis.mechanism import probe_at, probe_row
    from xdbert.analysis.representations import encoder_features, neutral_sentences, tower_features
    from xdbert.clip import clip_tokenizer
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.model.saving import load_clip_tower

    g, attributes = m.gates, list(facts.attributes)
    objects = [o.sing for o in facts.captioned()]
    classes = np.array([attributes.index(facts.real[o]) for o in objects])
    frames = neutral_sentences(m.sentences)

    null = probe.redrawn_classes(lambda k: m.facts(k).real, objects, attributes, probe.null_seeds(g["n_perm"]), m.seed)

    def row(features):
        return probe_at(probe_row(features, classes, null, len(attributes), g["lambda"]), g["probe_layer"])

    pairs = {}
    if "towers" in parts:
        towers = {}
        for side, name in (("real", "pretrain_clip"), ("twin", "pretrain_clip_nofacts")):
            tower, cfg = load_clip_tower(work / "models" / name)
            towers[side] = row(tower_features(tower, clip_tokenizer(cfg["clip"]), objects, frames))
        pairs["towers (gate A)"] = towers
    if "transfer" in parts:
        tok = load_encoder_tokenizer(str(work / "models" / "tokenizer"))
        for real, twin in zip(TRANSFER[::2], TRANSFER[1::2]):
            pairs[f"{real} (rung T)"] = {
                side: row(encoder_features(AutoModel.from_pretrained(str(work / "models" / "adapted" / family / name)),
                                           tok, objects, frames)) for side, name in (("real", real), ("twin", twin))}
    for r in pairs.values():
        r["flip_p"] = probe.sign_flip_p(np.array(r["real"]["correct"]), np.array(r["twin"]["correct"]), g["n_flip"], m.seed)
    return pairs


if __name__ == "__main__":
    main()
