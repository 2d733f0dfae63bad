"""De-risking the mechanism study (issue 55; ../shared/MECHANISM.md, "De-risk first").

Can facts that only CLIP's stand-in learned, from captions, reach the language encoder through XDBERT's
adaptation? On today's corpus and its 44 objects, before the study's world is built:

1. Facts: one attribute of `striped, spotted, plaid, floral` per object, balanced over the objects and
   as evenly as 44 allows within each stratum the corpus expresses (large x buildable); the twin table
   is drawn apart from it, every real attribute's objects spread over the twin attributes evenly.
2. Captions: 20,000: half the grounding analysis's generated scenes (no attribute word), half fact
   captions about one object, with its own attribute in 90% of them and the attribute as the token right
   after the object in 80%. The twin's captions are the same draws with the twin's table.
3. Two CLIP towers from the same random init, `--clip-steps` of next-token prediction on 50% caption
   blocks and 50% corpus blocks (the `pretrain_clip` recipe); the same batches for both.
4. Two adaptations of the project's pretrained encoder, `adapt`'s proposed setting (with `--set`
   overrides, the levers), one beside each tower.
5. The representation probe (xdbert/analysis/probe.py) of the real facts at every layer of both towers,
   of the encoder before adaptation (`pretrain_encoder`), after the baseline's adaptation, and after
   each XDBERT adaptation: leave-one-object-out ridge, a 1,000-draw permutation null, and for
   XDBERT(facts) against XDBERT(twin) a paired sign-flip test over objects.

The decision reads one layer per model, fixed here before any run: the layer the cross layers read (the
tower's output after ln_final; the encoder's last hidden layer). Preconditions: the facts tower's probe
>= 0.60 with p < 0.01 and the twin's inside its null; both towers' next-token accuracy on valid corpus
blocks >= 0.50; held-out MATCH >= 0.75 after both adaptations. GO: XDBERT(facts) - XDBERT(twin) >= 0.10
with the sign-flip p < 0.05, the baseline and XDBERT(twin) inside their nulls (p > 0.05).

    python bench/mechanism_derisk.py --project DIR [--facts-seed 100] [--clip-steps 2000] [--set KEY=VALUE ...]

DIR is a project after an embedded `dvc repro` (its shards, tokenizer and encoders are read, nothing is
written there). Writes bench/results/mechanism_derisk[_<levers>].md and .json; the towers and adapted
encoders go to --work.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import xdbert  # noqa: F401, E402  (first: it fixes the CPU kernels and threads before torch and numpy load)
import numpy as np  # noqa: E402

from xdbert.profiles import values  # noqa: E402
from xdbert.data.synthetic.words import PATTERNS as ATTRIBUTES  # noqa: E402

GATES = values("embedded")["mechanism"]["gates"]  # the pre-registered probe settings
LAMBDA, N_PERM, N_FLIP = GATES["lambda"], GATES["n_perm"], GATES["n_flip"]
N_SENTENCES = 20


def balanced_facts(objects: list, seed: int) -> tuple[dict[str, int], dict[str, int]]:
    """(real, twin): object -> attribute index. Real: each stratum's objects shuffled and dealt in turn
    round the attributes, one running count over the strata, so the totals are equal and each stratum is
    as even as its size allows. Twin: each real class's objects shuffled and dealt from a starting
    attribute that moves on with the class, so the twin's totals are equal too and knowing the real
    attribute says (almost) nothing of the twin's."""
    rng = random.Random(seed)
    strata: dict[tuple, list[str]] = {}
    for o in objects:
        strata.setdefault((o.large, o.buildable), []).append(o.sing)
    real, turn = {}, 0
    for key in sorted(strata):
        names = strata[key][:]
        rng.shuffle(names)
        for name in names:
            real[name] = turn % len(ATTRIBUTES)
            turn += 1
    twin, start = {}, 0
    for a in range(len(ATTRIBUTES)):
        names = sorted(n for n, v in real.items() if v == a)
        rng.shuffle(names)
        for i, name in enumerate(names):
            twin[name] = (start + i) % len(ATTRIBUTES)
        start += len(names)
    return real, twin


def fact_captions(facts: dict[str, int], n: int, seed: int) -> list[str]:
    """`n` captions about one object each. Every draw is the same whatever `facts` holds, so two tables
    give captions that differ in their attribute words alone."""
    from xdbert.data.synthetic import words as C

    rng = random.Random(seed)
    names = sorted(facts)
    out = []
    for _ in range(n):
        obj = rng.choice(names)
        other = rng.randrange(1, len(ATTRIBUTES))  # drawn always: the stream stays the same
        own = rng.random() < 0.9
        attr = ATTRIBUTES[(facts[obj] + (0 if own else other)) % len(ATTRIBUTES)]
        place = rng.choice(C.PLACES)
        where = f"{place.prep} the {place.name}"
        adj = rng.choice(C.SIZES)
        person = rng.choice(C.PERSONS).sing
        layout = rng.random()
        if layout < 0.8:  # the attribute right after the object: where a causal tower's state predicts it
            frame = rng.randrange(3)
            text = (f"{C.a(obj)} {obj} {attr} and {adj} {where}" if frame == 0 else
                    f"{C.a(person)} {person} holding {C.a(obj)} {obj} {attr} all over" if frame == 1 else
                    f"the {obj} {attr} like the others {where}")
        else:
            text = f"{C.a(attr)} {attr} {adj} {obj} {where}"
        out.append(text + ("." if rng.random() < 0.5 else ""))
    return out


def probe_layers(features: list[np.ndarray], classes: np.ndarray, seed: int) -> list[dict]:
    from xdbert.analysis import probe

    rows = []
    for layer, x in enumerate(features):
        correct = probe.loo_correct(x, classes, len(ATTRIBUTES), LAMBDA)
        null = probe.permutation_null(x, classes, len(ATTRIBUTES), LAMBDA, N_PERM, seed)
        rows.append({"layer": layer, "accuracy": float(correct.mean()), "p": probe.p_above(float(correct.mean()), null),
                     "null_mean": float(null.mean()), "null_q95": float(np.quantile(null, 0.95)),
                     "correct": correct.astype(int).tolist()})
    return rows


def next_token_accuracy(tower, blocks, eot: int, vocab) -> float:
    """Next-token accuracy over the ids `vocab` (the training blocks' ids), the `pretrain_clip` way."""
    import torch

    from xdbert.clip import clip_block_mask

    to_class = torch.full((int(max(int(vocab.max()), int(blocks.max()))) + 1,), -1, dtype=torch.long)
    to_class[vocab] = torch.arange(len(vocab))
    right = total = 0
    with torch.no_grad():
        for start in range(0, len(blocks), 256):
            ids = blocks[start:start + 256]
            valid = clip_block_mask(ids[:, None], eot)
            hidden = tower(ids[:, None], valid)
            follows = valid[:, 0, 1:].bool()
            logits = hidden[:, :-1][follows] @ tower.token_embedding.weight[vocab].T
            target = to_class[ids[:, 1:][follows]]
            keep = target >= 0
            right += int((logits.argmax(-1) == target)[keep].sum())
            total += int(keep.sum())
    return right / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True, help="a project after an embedded `dvc repro`")
    ap.add_argument("--facts-seed", type=int, default=100, help="100: the tuning seed (the study's own is 0)")
    ap.add_argument("--clip-steps", type=int, default=2000)
    ap.add_argument("--n-captions", type=int, default=20000)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an adapt setting for both adaptations (a lever: epochs=2, mlm_negatives=false, freeze_clip=true)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mechanism_derisk"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()

    import torch
    from transformers import AutoModel, AutoTokenizer

    from provenance import code_version, describe
    from xdbert import params, paths
    from xdbert.adaptation import pretraining
    from xdbert.adaptation.loop import BatchMaker, adapt
    from xdbert.adaptation.pretrain_settings import PretrainSettings
    from xdbert.adaptation.settings import AdaptSettings
    from xdbert.analysis import probe
    from xdbert.analysis.representations import encoder_features, neutral_sentences, tower_features
    from xdbert.clip import clip_special_ids, clip_tokenizer
    from xdbert.data import shards
    from xdbert.data.synthetic import words as C
    from xdbert.model.build import build_xdbert
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.files import CLIP_CONFIG
    from xdbert.model.saving import load_clip_tower, save_adapted, save_clip_tower
    from xdbert.model.settings import ModelSettings

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = args.out.resolve()
    os.chdir(args.project)  # the project's relative paths: read only
    p = params.load()
    family = p["adapt"]["family"]
    model = ModelSettings.from_params(p, family)
    settings = AdaptSettings.from_params(p, params.PROPOSED)
    levers = {}
    for item in args.set:
        key, _, value = item.partition("=")
        levers[key] = json.loads(value)
    settings = dataclasses.replace(settings, **levers)
    clip_settings = dataclasses.replace(PretrainSettings.clip_from_params(p, model.clip_pretrained), steps=args.clip_steps)

    objects = [o.sing for o in C.OBJECTS]
    real, twin = balanced_facts(C.OBJECTS, args.facts_seed)
    classes = np.array([real[o] for o in objects])
    twin_classes = np.array([twin[o] for o in objects])
    pairs = np.zeros((4, 4), int)
    for o in objects:
        pairs[real[o], twin[o]] += 1
    scenes = C.generate_captions(args.n_captions // 2, args.facts_seed)
    about = args.n_captions - len(scenes)
    captions = {"facts": scenes + fact_captions(real, about, args.facts_seed + 1),
                "twin": scenes + fact_captions(twin, about, args.facts_seed + 1)}
    assert sum(a != b for a, b in zip(*captions.values())) > 0.5 * about  # the twin differs where its attribute does
    assert not any(w in s.split() for s in scenes for w in ATTRIBUTES)

    ctok = clip_tokenizer(model.clip)
    _, eot = clip_special_ids(model.clip)
    for w in ATTRIBUTES + objects:
        if len(ctok.encode(w)) != 1:
            raise SystemExit(f"{w!r} is not one CLIP token")
    manifest = shards.read_manifest(paths.SHARDS)
    train, valid = (shards.open_shards(paths.SHARDS, split, verify=True) for split in ("train", "valid"))
    corpus_blocks = pretraining.shard_blocks(train)
    valid_blocks = pretraining.shard_blocks(valid)
    frames = neutral_sentences(N_SENTENCES)
    result = {**code_version(), "facts_seed": args.facts_seed, "clip_steps": args.clip_steps, "levers": levers,
              "lambda": LAMBDA, "n_perm": N_PERM, "pairs": pairs.tolist(), "objects": objects,
              "facts": {o: ATTRIBUTES[real[o]] for o in objects}, "towers": {}, "encoders": {}, "seconds": {}}

    towers = {}
    for name in ("facts", "twin"):
        t0 = time.time()
        directory = work / f"tower_{name}_{args.clip_steps}"
        cap_blocks = ctok(captions[name])
        mixed = torch.cat([cap_blocks, corpus_blocks[torch.arange(len(cap_blocks)) % len(corpus_blocks)]])
        if (directory / CLIP_CONFIG).is_file():  # trained by an earlier run with the same steps
            tower, _ = load_clip_tower(directory)
            trained = {"reused": str(directory)}
        else:
            torch.manual_seed(model.seed)  # both towers start from the same random weights
            tower = CLIPTextTower.build(model.clip, model.clip_pretrained)
            trained = pretraining.pretrain_clip(tower, mixed, eot, clip_settings, work / f"tower_{name}.pt")
            save_clip_tower(tower, directory, model.clip, model.clip_pretrained)
        tower.eval()
        vocab = torch.unique(mixed[mixed != 0])
        towers[name] = tower
        result["towers"][name] = {
            **trained, "corpus_next_token_accuracy": next_token_accuracy(tower, valid_blocks, eot, vocab),
            "probe": probe_layers(tower_features(tower, ctok, objects, frames), classes, args.facts_seed)}
        result["seconds"][f"tower_{name}"] = round(time.time() - t0, 1)
        print(f"tower {name}: {result['towers'][name]['corpus_next_token_accuracy']:.3f} next-token accuracy; probe "
              + ", ".join(f"L{r['layer']} {r['accuracy']:.2f} (p {r['p']:.3f})" for r in result["towers"][name]["probe"]), flush=True)

    tok = AutoTokenizer.from_pretrained(str(paths.TOKENIZER))
    adapted = {"pretrain_encoder": paths.pretrain_encoder(family), "baseline": paths.adapted(family, params.BASELINE)}
    suffix = "".join(f"_{k}{v}" for k, v in levers.items())
    for name in ("facts", "twin"):
        t0 = time.time()
        xd = build_xdbert(model, settings, vocab_size=len(tok), clip_blocks=manifest["n_blocks"], clip_eot_id=eot,
                          splits=(train, valid), clip_tower=work / f"tower_{name}_{args.clip_steps}")
        make_batch = BatchMaker(settings, manifest["n_blocks"], vocab_size=len(tok), special_ids=tok.all_special_ids,
                                mask_id=tok.mask_token_id, eot_id=eot)
        metrics = adapt(xd, train, valid, make_batch, settings, work / f"adapt_{name}{suffix}.pt")
        save_adapted(xd, work / f"adapted_{name}{suffix}", tokenizer_dir=paths.TOKENIZER)
        (work / f"adapt_{name}{suffix}.pt").unlink(missing_ok=True)
        adapted[f"xdbert_{name}"] = work / f"adapted_{name}{suffix}"
        result["encoders"][f"xdbert_{name}"] = {"adapt": {k: v for k, v in metrics.items() if k.startswith("valid_")}}
        result["seconds"][f"adapt_{name}"] = round(time.time() - t0, 1)
    for name, directory in adapted.items():
        encoder = AutoModel.from_pretrained(str(directory))
        rows = probe_layers(encoder_features(encoder, tok, objects, frames), classes, args.facts_seed)
        result["encoders"].setdefault(name, {})["probe"] = rows
        print(f"{name}: probe " + ", ".join(f"L{r['layer']} {r['accuracy']:.2f} (p {r['p']:.3f})" for r in rows), flush=True)

    # the twin tower read for its own facts: it must hold them as strongly as the real tower holds its own
    result["towers"]["twin"]["probe_own_facts"] = probe_layers(
        tower_features(towers["twin"], ctok, objects, frames), twin_classes, args.facts_seed)

    # the decision, on the layer the cross layers read
    def last(rows):
        return rows[-1]
    tf, tt = last(result["towers"]["facts"]["probe"]), last(result["towers"]["twin"]["probe"])
    xf, xt = last(result["encoders"]["xdbert_facts"]["probe"]), last(result["encoders"]["xdbert_twin"]["probe"])
    base = last(result["encoders"]["baseline"]["probe"])
    flip_p = probe.sign_flip_p(np.array(xf["correct"]), np.array(xt["correct"]), N_FLIP, args.facts_seed)
    match = {n: result["encoders"][f"xdbert_{n}"]["adapt"].get("valid_match_accuracy", float("nan")) for n in ("facts", "twin")}
    pre = {
        "facts tower probe >= 0.60, p < 0.01": tf["accuracy"] >= 0.60 and tf["p"] < 0.01,
        "twin tower inside its null (p > 0.05)": tt["p"] > 0.05,
        "towers' next-token accuracy on corpus >= 0.50": min(result["towers"][n]["corpus_next_token_accuracy"] for n in towers) >= 0.50,
        "held-out MATCH >= 0.75, both adaptations": min(match.values()) >= 0.75,
    }
    go = {
        "XDBERT(facts) - XDBERT(twin) >= 0.10": xf["accuracy"] - xt["accuracy"] >= 0.10,
        "sign-flip p < 0.05": flip_p < 0.05,
        "baseline inside its null": base["p"] > 0.05,
        "XDBERT(twin) inside its null": xt["p"] > 0.05,
    }
    # WEAK: the next lever of ../shared/MECHANISM.md's list is tried; after the last one, the study is NO-GO
    decision = ("GO" if all(pre.values()) and all(go.values()) else
                "PRECONDITION FAILED" if not all(pre.values()) else "WEAK")
    result.update({"difference": xf["accuracy"] - xt["accuracy"], "sign_flip_p": flip_p, "match": match,
                   "preconditions": pre, "go": go, "decision": decision})

    name = "mechanism_derisk" + suffix + ("" if args.clip_steps == 2000 else f"_clip{args.clip_steps}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Mechanism de-risk: facts seed {args.facts_seed}, CLIP steps {args.clip_steps}, levers {levers or 'none'}", "",
             describe(result), "", f"Decision: **{decision}**", "",
             "| check | holds |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in {**pre, **go}.items()]
    lines += ["", f"XDBERT(facts) {xf['accuracy']:.3f} - XDBERT(twin) {xt['accuracy']:.3f} = {xf['accuracy'] - xt['accuracy']:+.3f}, "
              f"sign-flip p {flip_p:.4f}; MATCH {match['facts']:.3f} / {match['twin']:.3f}", "",
              "Probe of the real facts, leave-one-object-out accuracy (permutation p), chance 0.25, per layer "
              "(0 = embeddings; the towers' last = after ln_final):", "",
              "| model | " + " | ".join(f"L{i}" for i in range(max(len(r["probe"]) for r in
                                                                   [*result["towers"].values(), *result["encoders"].values()]))) + " |",
              "|---|" + "---|" * max(len(r["probe"]) for r in [*result["towers"].values(), *result["encoders"].values()])]
    table = {**{f"tower {k}": v["probe"] for k, v in result["towers"].items()},
             "tower twin, its own facts": result["towers"]["twin"]["probe_own_facts"],
             **{k: v["probe"] for k, v in result["encoders"].items()}}
    for k, rows in table.items():
        lines.append(f"| {k} | " + " | ".join(f"{r['accuracy']:.2f} ({r['p']:.3f})" for r in rows) + " |")
    lines += ["", "Seconds: " + ", ".join(f"{k} {v}" for k, v in result["seconds"].items()), ""]
    (out_dir / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
