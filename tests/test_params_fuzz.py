"""Params fuzzing (hypothesis): `xdbert check` on generated params files.

`SCHEMA` gives every leaf key of the profiles its kind: values that pass, values of a wrong type, values of the
right type out of range. From it, each generated params file is a profile with
  (a) one value of a wrong type, (b) one value out of range, or (c) one unknown key or section: the check
      exits 2 with one line, `error: ...`, naming the key, and writes nothing;
  (d) valid values for one or several keys (the cross-key rules kept), maybe a new adapt variant: it passes.
(a), (b) and (d) run for every key of the schema (parametrized), wherever it occurs in any profile: about 1000
params files in all (`FILES`), in about a minute. They go through the command in this process (typer's
CliRunner); three fixed files through a real `xdbert check` subprocess. Derandomized: every run checks the
same files, so CI is reproducible; raise `FUZZ` (or drop `derandomize`) to search wider by hand.
"""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from xdbert import params as P
from xdbert import profiles
from xdbert.params_check import SECTION_KEYS
from xdbert.analysis.grounding import TASK_TITLES
from xdbert.cli import app
from xdbert.data.mechanism import GATE_KEYS, VIS, VIS_SIZES
from xdbert.data.vicomte import RELATIONS
from xdbert.data.synthetic.words import EXTRA_OBJECTS, OBJECTS, PATTERNS
from xdbert.data.tasks.registry import TASK_NAMES
from xdbert.data.tokenization.vocab import encoder_positions as positions_of
from xdbert.errors import PipelineError
from xdbert.finetuning.control.runs import Study
from xdbert.model import LOSSES, PAPER_LOSSES
from xdbert.model.families import FAMILY_KEYS
from xdbert.paths import CLIP_TOWERS, PRETRAIN_CLIP_NOFACTS

FUZZ = {"wrong_type": 2, "out_of_range": 2, "unknown_key": 30, "valid": 2}  # examples per key (per test for unknown_key)
# No shrinking: a failing example is reported as drawn (each draw is labelled with its key). Shrinking reruns the
# check hundreds of times, some 30 seconds a failing key: a schema change that failed every key ran for hours.
FUZZ_SETTINGS = dict(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# -- building blocks ---------------------------------------------------------------------------------------

WORD = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9_./:-]{0,20}", fullmatch=True)  # hub ids, folders, model names
NOT_INTEGER = st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer())
OTHER_TYPES = {"text": WORD, "int": st.integers(-5, 10**6), "float": NOT_INTEGER, "bool": st.booleans(),
               "none": st.none(), "list": st.lists(st.integers(0, 9), max_size=2),
               "dict": st.dictionaries(WORD, st.integers(0, 9), max_size=2)}


def wrong(*allowed: str) -> st.SearchStrategy:
    """Values of every type but `allowed` (a float that is an integer counts as an int)."""
    return st.one_of(*[s for kind, s in OTHER_TYPES.items() if kind not in allowed])


UNKNOWN = WORD.map(lambda w: f"{w}_unknown")  # no task, variant or run is called so
NOT_POSITIVE_INT = st.integers(-10**6, 0)
NOT_POSITIVE = st.one_of(st.floats(max_value=0, allow_nan=False), st.sampled_from([math.nan, math.inf]))
NOT_FRACTION = st.one_of(st.floats(min_value=1, exclude_min=True), st.floats(max_value=0, exclude_max=True),
                         st.just(math.nan))
EMPTY = st.sampled_from(["", "  "])

Strategy = Callable[[dict, tuple], "st.SearchStrategy | None"]  # (params, path) -> values, None: no such value


@dataclass(frozen=True)
class Spec:
    valid: Strategy   # values that pass, given the rest of the params (`valid_value` keeps the cross-key rules)
    wrong: st.SearchStrategy
    bad: Strategy     # values of the right type out of range


def spec(valid, wrong_type, bad=None) -> Spec:
    def fn(s):
        return s if callable(s) else (lambda p, path: s)
    return Spec(fn(valid), wrong_type, fn(bad))


def pos_int(hi: int = 10**6) -> Spec:
    return spec(st.integers(1, hi), wrong("int"), NOT_POSITIVE_INT)


def non_negative() -> Spec:
    return spec(st.integers(0, 2**32), wrong("int"), st.integers(max_value=-1))


def pos_float(hi: float = 10.0) -> Spec:
    return spec(st.floats(1e-7, hi), wrong("int", "float"), NOT_POSITIVE)


def fraction() -> Spec:
    return spec(st.floats(0, 1), wrong("int", "float"), NOT_FRACTION)


TARGETS = spec(st.floats(0, 1, exclude_min=True), wrong("int", "float"), st.one_of(NOT_FRACTION, st.just(0)))  # a loss's share of targets


def choice(*options) -> Spec:
    return spec(st.sampled_from(options), wrong("text"), WORD.filter(lambda w: w not in options))


def names(options: Callable[[dict], list], required: Callable[[dict], list] = lambda p: [], min_size: int = 0,
          bad: Strategy | None = None) -> Spec:
    """A list of distinct names drawn from `options(p)`, holding `required(p)`."""
    def valid(p, path):
        need = required(p)
        return st.lists(st.sampled_from(options(p)), unique=True, max_size=6).map(
            lambda more: need + [x for x in more if x not in need]).filter(lambda v: len(v) >= min_size)
    return spec(valid, wrong("list"), bad if bad is not None else st.lists(UNKNOWN, min_size=1, max_size=2))


FLAG = spec(st.booleans(), wrong("bool"))
HUB_NAME = spec(NAME, wrong("text"), EMPTY)
SEEDS = spec(st.lists(st.integers(0, 10**6), min_size=1, max_size=9, unique=True), wrong("list"),
             st.one_of(st.just([]), st.integers(0, 9).map(lambda s: [s, s]), st.integers(-10**6, -1).map(lambda s: [s])))
ADAPT_VARIANTS = lambda p: list(p["adapt"]["variants"])  # noqa: E731
FAMILIES = lambda p: list(p["families"])  # noqa: E731
STUDY_ON = lambda p: p["mechanism"]["enabled"]  # noqa: E731


def when_on(on: Any, off: Any) -> Strategy:
    """`on` where the mechanism study is enabled, else `off` (values, strategies or None)."""
    return lambda p, path: on if STUDY_ON(p) else off


def nofacts_towers(p: dict) -> list[str]:
    """The adaptations beside the study's twin tower (`adapt.clip_tower: pretrain_clip_nofacts`)."""
    return [name for name in [*p["adapt"]["variants"], "baseline", "xdbert"]
            if adapt_values(p, name)["clip_tower"] == PRETRAIN_CLIP_NOFACTS.name]


def current(p: dict, path: tuple) -> st.SearchStrategy:
    """The value `path` has now: where the rules tie a key to others, the simple valid value."""
    node = p
    for key in path:
        node = node[key]
    return st.just(node)


def object_count() -> Spec:
    """`mechanism.n_train` and the dev counts: with the study on they sum to the objects (kept as they are)."""
    return spec(lambda p, path: current(p, path) if STUDY_ON(p) else st.integers(1, 10**6), wrong("int"),
                lambda p, path: st.one_of(NOT_POSITIVE_INT, *([current(p, path).map(lambda n: n + 1)] if STUDY_ON(p) else [])))


def model_names(options: Callable[[dict], list]) -> Spec:
    """`mechanism.models` / `full_models`: names of `options(p)`; checked against the variants with the study on."""
    return names(options, bad=lambda p, path: st.one_of(st.just(["xdbert", "xdbert"]), st.just(["a.b"]),
                                                        *([st.lists(UNKNOWN, min_size=1, max_size=2)] if STUDY_ON(p) else [])))


def adapt_values(p: dict, name: str) -> dict:
    """The `adapt` keys of adaptation `name` (the proposed one, the baseline or a variant), overrides applied."""
    a = p["adapt"]
    return {**a, **((a["baseline"] if name == "baseline" else a["variants"].get(name)) or {})}


def with_clip(p: dict) -> list[str]:
    """The adaptations whose cross-modal model sees CLIP text: the ones `attention.variants` may name."""
    return [name for name in ["xdbert", *p["adapt"]["variants"]]
            if adapt_values(p, name)["cross_layers"] and not adapt_values(p, name)["placeholder"]]


def pick(options: list, fallback: Any) -> st.SearchStrategy:
    return st.sampled_from(options) if options else st.just(fallback)


def runs_of_every_grounding_task(p: dict) -> list[str]:
    """The models of `adapt.family` with a run on every grounding task (grounding names them without the family)."""
    study = Study.from_params(p)
    runs = [[r.name for r in study.runs(task)] for task in p["grounding"]["tasks"]]
    own = f"{study.ablation_family}/"
    return [name[len(own):] for name in runs[0] if name.startswith(own) and all(name in r for r in runs)]


def random_encoders(p: dict, families_only: bool = False) -> list[tuple[str, dict]]:
    """(encoder, merged encoder_config) of `model` (unless `families_only`) and of every family, where random."""
    m = p["model"]
    configs = [(f.get("encoder", m["encoder"]), {**(m["encoder_config"] or {}), **(f.get("encoder_config") or {})})
               for f in [*([] if families_only else [{}]), *p["families"].values()]]
    return [(e, c) for e, c in configs if e.startswith("random:")]


@cache
def _positions(encoder: str, config: tuple) -> int | None:
    return positions_of(encoder, dict(config))


def encoder_positions(p: dict, families_only: bool = False) -> int | None:
    """The bound the check knows of tokenize.max_len (every random encoder) or pretrain.max_len (the families'
    alone): the fewest positions of the random encoders, their config's or their model type's default."""
    bounds = []
    for e, c in random_encoders(p, families_only):
        try:
            bounds.append(_positions(e, tuple(sorted(c.items()))))
        except PipelineError:  # an unknown model type: `rules_kept` refuses it
            continue
    return min((b for b in bounds if b), default=None)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]


# Adapt keys a valid variant may override, each with the adapt key's spec (`valid_value` keeps the rules).
OVERRIDABLE = ("losses", "cross_layers", "clip_heads", "freeze_clip", "clip_tower", "mlm_negatives", "init_range", "cliptc_vocab",
               "text", "epochs", "lr", "warmup_ratio", "weight_decay", "mlm_prob", "attribute_mlm_prob", "match_prob",
               "cliptc_prob", "eval_windows",
               "precision", "compile", "seed")


def overrides(p: dict, path: tuple) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={k: SCHEMA[f"adapt.{k}"].valid(p, path + (k,)) for k in OVERRIDABLE})


# -- the schema: every leaf key of the profiles ---------------------------------------------------------------

SCHEMA: dict[str, Spec] = {
    "profile": choice(*P.PROFILES),
    "corpus.source": choice("generated", "hub"),
    "corpus.hub_id": HUB_NAME, "corpus.hub_config": HUB_NAME,
    "corpus.n_docs": pos_int(), "corpus.sentences_per_doc": pos_int(), "corpus.seed": non_negative(),

    "tasks.source": choice("generated", "hub"),
    "tasks.names": names(lambda p: list(TASK_NAMES), min_size=1,
                         required=lambda p: list(dict.fromkeys([*p["grounding"]["tasks"], p["attention"]["task"],
                                                                *p["finetune"]["ablation_tasks"], *p["finetune"]["clip_tasks"],
                                                                *([p["mechanism"]["control_task"]] if STUDY_ON(p) else [])])),
                         bad=st.one_of(st.just([]), st.just(["rte", "rte"]), st.just(["rte", VIS]),  # vis: the study adds it
                                       st.lists(UNKNOWN, min_size=1, max_size=2))),
    "tasks.train_size": pos_int(), "tasks.dev_size": pos_int(),
    "tasks.train_sizes": spec(st.dictionaries(st.sampled_from(TASK_NAMES), st.integers(1, 10**5), max_size=3),
                              wrong("dict", "none"), st.dictionaries(WORD.filter(lambda w: w not in TASK_NAMES),
                                                                     st.integers(1, 9), min_size=1, max_size=1)),
    "tasks.train_sizes.*": pos_int(),
    "tasks.read_path": spec(st.one_of(st.just(""), NAME), wrong("text"),
                            lambda p, path: EMPTY if p["tasks"]["source"] == "hub" and "read" in p["tasks"]["names"] else None),
    "tasks.read_dev_fraction": spec(st.floats(0, 1, exclude_min=True, exclude_max=True), wrong("float"),
                                    st.one_of(st.sampled_from([0, 1, 0.0, 1.0, math.nan]), NOT_FRACTION)),
    "tasks.glue_hub_id": HUB_NAME, "tasks.swag_hub_id": HUB_NAME, "tasks.seed": non_negative(),

    "model.encoder": spec(st.one_of(st.sampled_from(["random:bert", "random:electra", "bert-base-uncased"]), NAME),
                          wrong("text"), EMPTY),
    "model.clip": HUB_NAME,
    "model.clip_pretrained": spec(st.one_of(st.just(""), NAME), wrong("text")),
    "model.seed": non_negative(),
    "model.encoder_config.hidden_size": spec(
        lambda p, path: st.integers(1, 64).map(lambda k: k * (p["model"]["encoder_config"].get("num_attention_heads") or 1)),
        wrong("int"), lambda p, path: st.one_of(NOT_POSITIVE_INT, st.just(p["model"]["encoder_config"]["num_attention_heads"] + 1))),
    "model.encoder_config.num_attention_heads": spec(
        lambda p, path: st.sampled_from(divisors(p["model"]["encoder_config"]["hidden_size"])), wrong("int"),
        lambda p, path: st.one_of(NOT_POSITIVE_INT, st.just(p["model"]["encoder_config"]["hidden_size"] + 1))),
    "model.encoder_config.num_hidden_layers": pos_int(48),
    "model.encoder_config.intermediate_size": pos_int(8192),
    "model.encoder_config.max_position_embeddings": spec(  # at least what the max_lens bounded by it ask for
        lambda p, path: st.integers(*(lambda lo: (lo, max(lo, 4096)))(
            max(p["tokenize"]["max_len"], p["pretrain"]["max_len"]) if random_encoders(p) else 1)),
        wrong("int"), NOT_POSITIVE_INT),
    "model.encoder_config.embedding_size": pos_int(4096),
    "model.encoder_config.hidden_dropout_prob": fraction(),
    "model.encoder_config.attention_probs_dropout_prob": fraction(),

    "tokenize.vocab_size": pos_int(), "tokenize.n_blocks": spec(st.integers(1, 425), wrong("int"),
                                                              st.one_of(NOT_POSITIVE_INT, st.integers(426, 10**5))),
    "tokenize.max_len": spec(lambda p, path: st.integers(8, min(encoder_positions(p) or 32767, 32767)), wrong("int"),
                             lambda p, path: st.one_of(st.integers(-10, 7), st.integers((encoder_positions(p) or 32767) + 1, 10**5))),
    "tokenize.shard_windows": pos_int(), "tokenize.max_overflow": fraction(),
    "tokenize.validate_windows": non_negative(), "tokenize.workers": pos_int(64),

    **{f"pretrain.{k}": pos_int() for k in ("steps", "batch_size", "checkpoint_every")},
    "pretrain.max_len": spec(lambda p, path: st.integers(1, encoder_positions(p, families_only=True) or 10**6), wrong("int"),
                             NOT_POSITIVE_INT),
    "pretrain.lr": pos_float(),
    **{f"pretrain.{k}": fraction() for k in ("restate_mask_prob", "warmup_ratio", "weight_decay")},
    "pretrain.mlm_prob": TARGETS,
    "pretrain.seed": non_negative(), "pretrain.clip_steps": non_negative(),

    "adapt.losses": spec(st.lists(st.sampled_from(LOSSES), min_size=1, unique=True), wrong("list"),
                         st.sampled_from([[], ["itm"], ["mlm", "mlm"]])),
    "adapt.cross_layers": spec(st.integers(0, 6), wrong("int"),
                               lambda p, path: st.integers(-9, -1) if path[:2] == ("adapt", "baseline") else st.integers(-9, 0)),
    "adapt.clip_heads": pos_int(16),
    "adapt.placeholder": spec(st.booleans(), wrong("bool"), lambda p, path: None if path[1] != "placeholder" else st.just(True)),
    "adapt.clip_tower": spec(st.sampled_from(CLIP_TOWERS), wrong("text"),  # the twin only where the study is on
                             when_on(WORD, st.just(PRETRAIN_CLIP_NOFACTS.name))),
    "adapt.freeze_clip": FLAG, "adapt.mlm_negatives": FLAG, "adapt.compile": FLAG,
    **{f"adapt.loss_weights.{name}": pos_float(100.0) for name in (*PAPER_LOSSES, "distill")},  # distill: rung T's variant
    "adapt.init_range": spec(st.one_of(st.none(), st.floats(1e-5, 1.0)), wrong("int", "float", "none"), NOT_POSITIVE),
    "adapt.cliptc_vocab": choice("full", "shards"),
    "adapt.text": choice("corpus", "captions"),
    "adapt.epochs": pos_int(50), "adapt.lr": pos_float(),
    **{f"adapt.{k}": fraction() for k in ("warmup_ratio", "weight_decay")},
    "adapt.mlm_prob": TARGETS,  # every variant of every profile has MLM
    "adapt.attribute_mlm_prob": spec(  # above 0 only where `mechanism.patterns` names the words it masks
        lambda p, path: st.floats(0, 1) if p["mechanism"]["patterns"] else st.just(0.0), wrong("int", "float"), NOT_FRACTION),
    "adapt.cliptc_prob": spec(st.floats(0, 1, exclude_min=True), wrong("int", "float"), NOT_FRACTION),
    "adapt.match_prob": spec(st.floats(0, 1, exclude_min=True, exclude_max=True), wrong("int", "float"), NOT_FRACTION),
    "adapt.batch_size": spec(lambda p, path: st.integers(p["adapt"]["micro_batch_size"], 4096), wrong("int"),
                             lambda p, path: st.integers(-9, p["adapt"]["micro_batch_size"] - 1)),
    "adapt.micro_batch_size": spec(lambda p, path: st.integers(1, p["adapt"]["batch_size"]), wrong("int"),
                                   lambda p, path: st.one_of(NOT_POSITIVE_INT, st.integers(p["adapt"]["batch_size"] + 1, 10**5))),
    "adapt.checkpoint_every": pos_int(), "adapt.eval_windows": pos_int(),
    "adapt.precision": choice("auto", "bf16", "fp16", "no"), "adapt.seed": non_negative(),
    "adapt.family": spec(lambda p, path: st.sampled_from(FAMILIES(p)), wrong("text"),
                         lambda p, path: UNKNOWN),

    "families.*.label": spec(NAME, wrong("text"), EMPTY),
    "families.*.size": choice("base", "large"),
    "families.*.layer_lr_decay": spec(st.floats(0, 1, exclude_min=True), wrong("int", "float"),
                                      st.one_of(st.sampled_from([0, 0.0, 1.5, math.nan]), st.floats(max_value=0))),
    "families.*.encoder": spec(st.sampled_from(["random:bert", "random:electra"]), wrong("text"), EMPTY),

    "pwcca.clip_tower": spec(st.one_of(st.just(""), NAME), wrong("text")),
    "pwcca.pairs": spec(lambda p, path: st.lists(st.permutations([*FAMILIES(p), "clip", "random"]).map(lambda s: s[:2]),
                                                 min_size=1, max_size=4),
                        wrong("list"), st.sampled_from([[], [["clip", "clip"]], [["clip", "encoder_unknown"]], [["clip"]], ["clip"]])),
    "pwcca.eps": spec(st.one_of(st.floats(0, 1e-2), st.just(0)), wrong("int", "float"),
                      st.one_of(st.floats(max_value=0, exclude_max=True), st.sampled_from([math.nan, math.inf]))),
    "pwcca.weight_by": choice("x", "y", "smaller"), "pwcca.convention": choice("svcca", "whitened"), "pwcca.min_words_ratio": pos_float(50.0), "pwcca.seed": non_negative(),

    "grounding.tasks": names(lambda p: [t for t in TASK_TITLES if t in p["tasks"]["names"]],
                             required=lambda p: [p["grounding"]["examples_task"]],
                             bad=st.one_of(st.just([]), st.just(["swag"]), st.lists(UNKNOWN, min_size=1, max_size=1))),
    "grounding.baseline": spec(  # and not the run the other key names: Figure 4 compares two
        lambda p, path: st.sampled_from(runs_of_every_grounding_task(p)).filter(
            lambda run: run != p["grounding"]["model" if path[-1] == "baseline" else "baseline"]),
        wrong("text"), st.one_of(EMPTY, UNKNOWN)),
    "grounding.threshold": pos_int(),
    "grounding.captions": spec(when_on(st.just("generated"),  # the study's captions state its facts
                                       st.one_of(st.sampled_from(["generated", "data/coco/captions_train2017.json"]),
                                                 NAME.filter(lambda n: n.count("/") <= 1))),  # a datasets id is owner/name
                               wrong("text"), lambda p, path: st.sampled_from([*(["data/coco/captions_train2017.json"] if STUDY_ON(p) else []),
                                                                                "", "inputs/coco/captions.txt"])),
    "grounding.captions_hub_split": HUB_NAME, "grounding.captions_hub_column": HUB_NAME,
    "grounding.n_captions": pos_int(), "grounding.seed": non_negative(),
    "grounding.stopwords": spec(st.one_of(st.just(""), NAME), wrong("text", "none")),
    "grounding.examples_task": spec(lambda p, path: st.sampled_from(p["grounding"]["tasks"]), wrong("text"),
                                    lambda p, path: st.sampled_from([t for t in TASK_NAMES if t not in p["grounding"]["tasks"]])),
    "grounding.examples_per_class": pos_int(100),

    "attention.variants": names(with_clip, min_size=1,
                                bad=st.one_of(st.just([]), st.just(["xdbert", "xdbert"]), st.just(["baseline"]),
                                              st.just(["placeholder"]), st.just(["caption_mlm"]),
                                              st.lists(UNKNOWN, min_size=1, max_size=1))),
    "attention.task": spec(lambda p, path: pick([t for t in p["tasks"]["names"] if t != "swag"], "rte"), wrong("text"),
                           lambda p, path: st.sampled_from(["swag", "wnli", *[t for t in TASK_NAMES if t not in p["tasks"]["names"]]])),
    "attention.index": non_negative(),
    **{f"attention.{k}": pos_int(1024) for k in ("max_len", "clip_blocks_per_sentence", "windows", "batch_size")},

    **{f"finetune.lr.*.{size}": pos_float(1.0) for size in ("base", "large", "full")},
    "finetune.models": names(lambda p: ["baseline", "xdbert"], required=lambda p: ["baseline", "xdbert"],
                             bad=st.one_of(st.lists(UNKNOWN, min_size=1, max_size=2),
                                           st.just(["baseline", "mlm"]),  # an ablation: adapt.family's alone
                                           st.just(["xdbert"]))),  # every Δ row is against the baseline
    "finetune.ablations": names(lambda p: [*ADAPT_VARIANTS(p), "baseline", "xdbert"],  # those two unless Table 1 runs them
                                bad=st.one_of(st.lists(UNKNOWN, min_size=1, max_size=2), st.just(["mlm", "xdbert"]))),
    "finetune.full_models": names(lambda p: ["xdbert"], required=lambda p: ["xdbert"], bad=st.just(["baseline"])),
    "finetune.ablation_tasks": names(lambda p: list(p["tasks"]["names"])),  # the study's tasks only
    "finetune.clip_tasks": names(lambda p: list(p["tasks"]["names"])),
    "finetune.seeds": SEEDS, "finetune.rte_seeds": SEEDS,
    "finetune.ablation_lr": spec(st.one_of(st.none(), st.floats(1e-7, 1.0)), wrong("int", "float", "none"), NOT_POSITIVE),
    "finetune.ablation_seeds": spec(st.one_of(st.none(), SEEDS.valid(None, None)), wrong("list", "none"), SEEDS.bad(None, None)),
    "finetune.epochs": pos_int(100), "finetune.batch_size": pos_int(4096), "finetune.eval_batch_size": pos_int(4096),
    "finetune.max_len": spec(st.integers(1, 512), wrong("int"), st.one_of(NOT_POSITIVE_INT, st.integers(513, 10**5))),
    **{f"finetune.{k}": fraction() for k in ("warmup_ratio", "weight_decay", "dropout")},
    "finetune.length_group": pos_int(1000), "finetune.clip_blocks_per_sentence": pos_int(16),
    "finetune.precision": choice("auto", "bf16", "fp16", "no"), "finetune.compile": FLAG, "finetune.cuda_graph": FLAG, "finetune.stack": pos_int(64),

    "mechanism.enabled": spec(st.booleans(), wrong("bool"),  # off, where an adaptation's tower is the study's twin
                              lambda p, path: st.just(False) if nofacts_towers(p) else None),
    "mechanism.extra_objects": spec(lambda p, path: current(p, path) if STUDY_ON(p) else st.integers(0, len(EXTRA_OBJECTS)), wrong("int"),
                                    st.one_of(st.integers(-10**6, -1), st.integers(len(EXTRA_OBJECTS) + 1, 10**6))),
    "mechanism.patterns": spec(  # the study's `vis` is 4-way: all four words; off, none or at least two
        when_on(st.permutations(PATTERNS), st.permutations(PATTERNS).flatmap(
            lambda words: st.sampled_from([0, 2, 3, 4]).map(lambda n: list(words[:n])))),
        wrong("list"), lambda p, path: st.sampled_from([*([PATTERNS[:3], []] if STUDY_ON(p) else []),
                                                         [PATTERNS[0]], [PATTERNS[0], PATTERNS[0]], ["dotted", PATTERNS[0]]])),
    "mechanism.seed": non_negative(),
    **{f"mechanism.{k}": object_count() for k in ("n_train", "n_dev_captioned", "n_dev_uncaptioned")},
    **{f"mechanism.{k}": fraction() for k in ("fact_share", "fact_rate", "after_object", "caption_share")},
    "mechanism.caption_frames": spec(st.integers(1, 10), wrong("int"), st.one_of(st.integers(-5, 0), st.integers(11, 50))),
    **{f"mechanism.vis.{k}": pos_int() for k in VIS_SIZES},
    "mechanism.models": model_names(lambda p: ["baseline", "xdbert", *ADAPT_VARIANTS(p)]),
    "mechanism.full_models": model_names(lambda p: ["xdbert", *ADAPT_VARIANTS(p)]),
    "mechanism.clip_towers": names(lambda p: list(CLIP_TOWERS), min_size=1,
                                   bad=st.one_of(st.just([CLIP_TOWERS[0]] * 2), st.just([]), st.lists(UNKNOWN, min_size=1, max_size=2))),
    "mechanism.control_task": spec(  # the study on: a task it runs (`tasks.names`; not `vis`, which it adds)
        lambda p, path: st.sampled_from(p["tasks"]["names"] if STUDY_ON(p) else TASK_NAMES), wrong("text"),
        lambda p, path: st.one_of(*([st.sampled_from([VIS, *[t for t in TASK_NAMES if t not in p["tasks"]["names"]], "rte_unknown"])]
                                           if STUDY_ON(p) else []), EMPTY)),
    "mechanism.sentences": pos_int(1000),
    "mechanism.bow_seeds": spec(SEEDS.valid(None, None), wrong("list"),  # a seed twice first: the section's own check
                                st.one_of(st.integers(0, 9).map(lambda s: [s, s]), SEEDS.bad(None, None))),
    "mechanism.replication": spec(st.one_of(st.just(""), NAME), wrong("text")),
    "mechanism.gates.level": spec(st.floats(0, 1, exclude_min=True, exclude_max=True), wrong("float"),
                                  st.one_of(st.sampled_from([0.0, 1.0]), NOT_FRACTION)),
    **{f"mechanism.gates.{k}": pos_int() for k in ("n_boot", "exact_below", "n_perm", "n_flip")},
    "mechanism.gates.lambda": pos_float(100.0),
    "mechanism.gates.probe_layer": choice("cross_input"),
    **{f"mechanism.gates.{k}": fraction() for k in ("alpha_a", "alpha_c", "alpha_d", "alpha_e", "m_accuracy", "alpha_r", "alpha_t")},

    "aggregate.n_boot": pos_int(), "aggregate.seed": non_negative(),
    "hub.revisions": spec(st.dictionaries(NAME, WORD, max_size=2), wrong("dict"),
                          st.dictionaries(NAME, EMPTY, min_size=1, max_size=1)),
    "probes.cv_folds": spec(st.integers(2, 20), wrong("int"), st.one_of(st.just(1), NOT_POSITIVE_INT)),
    "probes.n_boot": pos_int(),
    "probes.enabled": FLAG, "probes.vicomte_dir": HUB_NAME, "probes.coda_hub_id": HUB_NAME, "probes.reference": HUB_NAME,
    "probes.relations": names(lambda p: list(RELATIONS), min_size=1,
                              bad=st.one_of(st.just([]), st.just(["color", "color"]), st.lists(UNKNOWN, min_size=1, max_size=2))),
}
SCHEMA["grounding.model"] = SCHEMA["grounding.baseline"]
NEW_VARIANT = spec(overrides, wrong("dict", "none"))  # a variant entry of its own: no profile has an empty one


def schema_key(path: tuple) -> str:
    """The SCHEMA key of a leaf: a variant's override has its adapt key's spec; task names are `*`."""
    if path[:2] == ("adapt", "variants"):
        return "adapt.variants.*" if len(path) == 3 else "adapt." + ".".join(path[3:])
    if path[:2] == ("adapt", "baseline"):
        return "adapt." + ".".join(path[2:])
    if path[0] == "families":  # a family's encoder_config merges into model's: the same keys
        return "model." + ".".join(path[2:]) if path[2] == "encoder_config" else "families.*." + path[2]
    if path[:2] == ("finetune", "lr"):
        return f"finetune.lr.*.{path[3]}"
    if path[:2] == ("tasks", "train_sizes") and len(path) == 3:
        return "tasks.train_sizes.*"
    return ".".join(path)


# -- the cross-key rules the valid values keep (xdbert/adaptation/settings.py, xdbert/model/settings.py,
#    xdbert/data/tasks/settings.py, xdbert/data/mechanism.py, xdbert/data/captions.py, xdbert/analysis/pwcca.py,
#    xdbert/params_check.py) ---------------------------------------------------------------------------------

def rules_kept(p: dict) -> bool:
    a, m, t, f, g = p["adapt"], p["model"], p["tasks"], p["finetune"], p["grounding"]
    for name in [*a["variants"], "baseline", "xdbert"]:
        s = adapt_values(p, name)
        if s["micro_batch_size"] > s["batch_size"] or (s["placeholder"] and set(s["losses"]) & {"match", "cliptc"}) \
                or ("match" in s["losses"] and s["micro_batch_size"] < 2):
            return False
        if s["cross_layers"] == 0 and (set(s["losses"]) - {"distill", "kl"} != {"mlm"} or s["placeholder"]):
            return False
        if "kl" in s["losses"] and ("mlm" not in s["losses"] or s["placeholder"]):
            return False
        if s["text"] in ("captions", "captions_nofacts") and (s["cross_layers"] != 0 or s["losses"] != ["mlm"]):
            return False
        if "distill" in s["losses"] and (s["placeholder"] or "distill" not in (s["loss_weights"] or {})):
            return False
    cfg = m["encoder_config"] or {}
    if cfg.get("hidden_size", 1) % cfg.get("num_attention_heads", 1) or p["tokenize"]["max_len"] > (encoder_positions(p) or 32767):
        return False
    for encoder, config in random_encoders(p):  # a model type transformers knows
        try:
            _positions(encoder, tuple(sorted(config.items())))
        except PipelineError:
            return False
    if p["pretrain"]["max_len"] > (encoder_positions(p, families_only=True) or 10**6):
        return False
    if t["source"] == "hub" and "read" in t["names"] and not t["read_path"].strip():
        return False
    if a["family"] not in p["families"] or not {x for pair in p["pwcca"]["pairs"] for x in pair} <= {*p["families"], "clip", "random"}:
        return False
    variants = list(a["variants"])
    mech = p["mechanism"]
    if nofacts_towers(p) and not mech["enabled"]:  # the twin tower is the study's
        return False
    if mech["enabled"] and (sorted(mech["patterns"]) != sorted(PATTERNS) or g["captions"] != "generated"
                            or mech["n_train"] + mech["n_dev_captioned"] + mech["n_dev_uncaptioned"] != len(OBJECTS) + mech["extra_objects"]
                            or mech["control_task"] not in t["names"] or not set(mech["models"]) <= {*variants, "baseline", "xdbert"}
                            or not set(mech["full_models"]) <= {*variants, "xdbert"}):
        return False
    return (set(f["models"]) <= {"baseline", "xdbert"} and set(f["full_models"]) <= {"xdbert"}
            and set(f["ablations"]) <= {*variants, "baseline", "xdbert"} and not set(f["ablations"]) & set(f["models"])
            and set(p["attention"]["variants"]) <= set(with_clip(p)) and p["attention"]["task"] in t["names"]
            and set(g["tasks"]) <= set(t["names"]) and g["examples_task"] in g["tasks"]
            and {g["baseline"], g["model"]} <= set(runs_of_every_grounding_task(p)) and g["baseline"] != g["model"])


# -- params files and the check ----------------------------------------------------------------------------

class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    """Quotes every string that the params Loader reads as a number (YAML 1.2 floats such as 1e5)."""


Dumper.yaml_implicit_resolvers = copy.deepcopy(P.Loader.yaml_implicit_resolvers)


@cache
def _values(profile: str) -> dict:
    return profiles.values(profile)


def values(profile: str) -> dict:
    """The complete params of `profile` (a fresh copy)."""
    return copy.deepcopy(_values(profile))


@cache
def leaf_paths(profile: str) -> list[tuple]:
    return [path for path, _ in profiles.leaves(_values(profile))]


def with_value(p: dict, path: tuple, value: Any) -> dict:
    p = copy.deepcopy(p)
    node = p
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return p


def valid_value(data, p: dict, path: tuple) -> Any:
    key = schema_key(path)
    s = (NEW_VARIANT if key == "adapt.variants.*" else SCHEMA[key]).valid(p, path)
    return data.draw(s.filter(lambda v: rules_kept(with_value(p, path, v))), label=".".join(path))


RUNNER = CliRunner()


def dump(p: dict) -> str:
    return yaml.dump(p, Dumper=Dumper, sort_keys=False, allow_unicode=True)


def run_check(workdir, p: dict):
    """`xdbert check params.yaml` in this process, on `p` written to `workdir`: (exit code, stdout, stderr)."""
    text = dump(p)
    path = workdir / "params.yaml"
    path.write_text(text, encoding="utf-8")
    result = RUNNER.invoke(app, ["check", "params.yaml"])
    crash = result.exception if not isinstance(result.exception, SystemExit) else None
    assert crash is None, "".join(traceback.format_exception(*result.exc_info))
    assert sorted(os.listdir(workdir)) == ["params.yaml"] and path.read_text(encoding="utf-8") == text  # nothing written
    return result.exit_code, result.stdout, result.stderr


def assert_refused(workdir, p: dict, key: str) -> None:
    code, out, err = run_check(workdir, p)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    assert key in lines[0], (key, lines[0])


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- the tests --------------------------------------------------------------------------------------------

# Every key is fuzzed on its own (parametrized), at every place of every profile where it occurs.
PATHS = {key: [(name, path) for name in P.PROFILES for path in leaf_paths(name) if schema_key(path) == key] for key in SCHEMA}
BAD_PATHS = {key: [(name, path) for name, path in paths if SCHEMA[key].bad(_values(name), path) is not None]
             for key, paths in PATHS.items()}
BAD_PATHS = {key: paths for key, paths in BAD_PATHS.items() if paths}  # booleans, free strings: no value is out of range
FILES = {"wrong_type": FUZZ["wrong_type"] * len(SCHEMA), "out_of_range": FUZZ["out_of_range"] * len(BAD_PATHS),
         "unknown_key": FUZZ["unknown_key"], "valid": FUZZ["valid"] * len(SCHEMA)}  # params files per strategy
assert sum(FILES.values()) >= 100


def test_schema_covers_exactly_the_keys_of_the_profiles():
    keys = {schema_key(path) for name in P.PROFILES for path in leaf_paths(name)}
    assert keys == set(SCHEMA), (sorted(keys - set(SCHEMA)), sorted(set(SCHEMA) - keys))


@pytest.mark.parametrize("profile", P.PROFILES)
def test_every_profile_passes_and_keeps_the_rules(workdir, profile):
    p = values(profile)
    assert rules_kept(p)
    code, out, err = run_check(workdir, p)
    assert (code, err) == (0, "") and out == f"params.yaml: valid ({profile} profile); every stage's params check passes\n"


@pytest.mark.parametrize("key", sorted(SCHEMA))
@settings(max_examples=FUZZ["wrong_type"], **FUZZ_SETTINGS)
@given(data=st.data())
def test_a_value_of_a_wrong_type_is_refused_in_one_line_naming_the_key(workdir, key, data):
    profile, path = data.draw(st.sampled_from(PATHS[key]))
    value = data.draw(SCHEMA[key].wrong, label=".".join(path))
    assert_refused(workdir, with_value(values(profile), path, value), ".".join(path))


@pytest.mark.parametrize("key", sorted(BAD_PATHS))
@settings(max_examples=FUZZ["out_of_range"], **FUZZ_SETTINGS)
@given(data=st.data())
def test_a_value_out_of_range_is_refused_in_one_line_naming_the_key(workdir, key, data):
    profile, path = data.draw(st.sampled_from(BAD_PATHS[key]))
    p = values(profile)
    value = data.draw(SCHEMA[key].bad(p, path), label=".".join(path))
    assert_refused(workdir, with_value(p, path, value), ".".join(path))


def unknown_key(p: dict) -> st.SearchStrategy:
    """(params `p` with one key or section that no stage reads, the key the error must name)."""
    adapt_keys = [k for k in SECTION_KEYS["adapt"] if k not in ("variants", "baseline")]
    places = {  # where -> (the names known there, the key the error names; None: the new key itself)
        (): ([*P.SECTIONS, "profile"], None), **{(section,): (keys, None) for section, keys in SECTION_KEYS.items() if keys},
        ("families",): (list(p["families"]), None),  # a new family that is no mapping
        **{("families", name): (FAMILY_KEYS, f"families.{name}") for name in p["families"]},
        ("tasks", "train_sizes"): (TASK_NAMES, "tasks.train_sizes"), ("finetune", "lr"): ([*TASK_NAMES, VIS], "finetune.lr"),
        ("mechanism", "vis"): (VIS_SIZES, "mechanism.vis"), ("mechanism", "gates"): (GATE_KEYS, "mechanism.gates"),
        ("adapt", "loss_weights"): (LOSSES, "adapt.loss_weights"), ("adapt", "baseline"): (adapt_keys, "adapt.baseline"),
        **{("adapt", "variants", v): (adapt_keys, f"adapt.variants.{v}") for v in p["adapt"]["variants"]},
        **{("finetune", "lr", task): (("base", "large", "full"), f"finetune.lr.{task}") for task in p["finetune"]["lr"]},
    }  # not model.encoder_config: any transformers config key may go there

    def build(where: tuple, name: str, value: Any) -> tuple[dict, str]:
        return with_value(p, where + (name,), value), places[where][1] or ".".join(where + (name,))

    def names_for(where: tuple) -> st.SearchStrategy:
        overrides = where[:2] == ("adapt", "variants") or where == ("adapt", "baseline")  # variants/baseline are no overrides
        return (st.one_of(WORD, st.sampled_from(["variants", "baseline"])) if overrides else WORD).filter(
            lambda w: w not in places[where][0])

    return st.sampled_from(list(places)).flatmap(
        lambda where: st.tuples(st.just(where), names_for(where), st.one_of(st.integers(0, 9), WORD))).map(lambda t: build(*t))


@settings(max_examples=FUZZ["unknown_key"], **FUZZ_SETTINGS)
@given(data=st.data())
def test_an_unknown_key_or_section_is_refused_in_one_line_naming_it(workdir, data):
    p, key = data.draw(unknown_key(values(data.draw(st.sampled_from(P.PROFILES)))))
    assert_refused(workdir, p, key)


@pytest.mark.parametrize("key", sorted(SCHEMA))
@settings(max_examples=FUZZ["valid"], **FUZZ_SETTINGS)
@given(data=st.data())
def test_random_valid_values_pass(workdir, key, data):
    """A valid value for `key`, and for up to three other keys of the same profile; maybe a new variant."""
    profile, path = data.draw(st.sampled_from(PATHS[key]))
    p = values(profile)
    others = [other for other in leaf_paths(profile) if other != path]
    for changed in [path, *data.draw(st.lists(st.sampled_from(others), max_size=3, unique=True))]:
        p = with_value(p, changed, valid_value(data, p, changed))
    if data.draw(st.booleans()):
        name = data.draw(WORD.filter(lambda w: w not in p["adapt"]["variants"] and w not in ("baseline", "xdbert")))
        p = with_value(p, ("adapt", "variants", name), valid_value(data, p, ("adapt", "variants", name)))
    assert P.read_yaml_text(dump(p)) == p  # the file says what was drawn
    code, out, err = run_check(workdir, p)
    assert code == 0 and err == "" and "valid" in out, (code, err)


@pytest.mark.slow
def test_the_command_exits_2_with_one_line_and_writes_nothing(workdir):
    """The real console command, in a process of its own: exit codes and streams as a shell sees them."""
    def xdbert_check(text: str) -> subprocess.CompletedProcess:
        (workdir / "params.yaml").write_text(text, encoding="utf-8")
        r = subprocess.run([sys.executable, "-m", "xdbert.cli", "check"], cwd=workdir, capture_output=True, text=True)
        assert sorted(os.listdir(workdir)) == ["params.yaml"] and (workdir / "params.yaml").read_text(encoding="utf-8") == text
        return r

    r = xdbert_check(profiles.render("paper"))
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.startswith("params.yaml: valid (paper profile)")
    text = profiles.render("embedded").replace("    mlm: {losses: [mlm]}", "    mlm: {losses: mlm}")
    r = xdbert_check(text)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == ["error: `adapt.variants.mlm.losses` must be a list drawn from: mlm, match, cliptc, distill, kl; got 'mlm'"]
    r = xdbert_check(profiles.render("embedded").replace("\n  n_boot: 200 ", "\n  n_boots: 10\n  n_boot: 200 "))  # aggregate's
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: unknown param `aggregate.n_boots` (did you mean `aggregate.n_boot`?); `aggregate` has: n_boot, seed"]
