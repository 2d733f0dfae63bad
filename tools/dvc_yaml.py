"""Write dvc.yaml from one definition per stage template, so that its `deps:` and `params:` cannot drift.

    python tools/dvc_yaml.py           # write dvc.yaml (atomically)
    python tools/dvc_yaml.py --check   # exit 1 when the committed dvc.yaml differs from what this writes

Code deps: the stage script's import closure (xdbert.imports.closure), with the files its modules load: the
hub pins (hub.lock.json) where xdbert/hub.py runs, the MKL dispatch C source where xdbert/numerics.py does,
and the package resources their modules read.

Params: what the stage reads, recorded. Each stage script has `read(p, *args)`, every param it reads,
checked, before any work (its `main` touches params through it alone; tests/test_params_lists.py holds
that). `read` is called on a `Recorder` of each profile's values (embedded, paper, micro and the
rehearsal's) for every family and variant of the template; the key paths read, less the template's
`unused` keys (each with its reason), are its `params:`. params.yaml's values play no part, so the file
is the same whichever profile is switched on.

Metrics: every JSON result kept in git (`cache: false`) is declared a metric, not a plain output: DVC's run
cache skips any stage with a plain uncached output (`Stage.run`), so `dvc exp run` back to earlier params
would retrain instead of restoring. metrics/headline.json (xdbert.reports.headline) holds the few numbers
that `dvc exp show` puts side by side; the README's command drops the other files' columns.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xdbert import io, profiles  # noqa: E402
from xdbert.adaptation.settings import AdaptSettings  # noqa: E402
from xdbert.imports import closure  # noqa: E402
from xdbert.params import PROFILES, read_yaml_text  # noqa: E402
from xdbert.rehearse import rehearsal_params  # noqa: E402

DVC_YAML = ROOT / "dvc.yaml"
KEY, FAMILY = "${key}", "${adapt.family}"  # a foreach item, and Table 3's family, in dvc.yaml's own syntax
ANY = "*"  # after a mapping's path: which keys it has was read (DVC: the mapping whole)
COLLECTIONS = (("families",), ("adapt", "variants"))  # mappings of named items, a stage for each

# Files a module loads, deps of every stage that runs it: listed right after the module, or after all modules
BESIDE = {"xdbert/numerics.py": "xdbert/mkl_dispatch.c"}  # decides which GEMM kernels MKL runs, so bytes
LOADED = {"xdbert/clip.py": "xdbert/resources/xdbert-tiny.json",
          "xdbert/analysis/grounding.py": "xdbert/resources/stopwords_en.txt",
          "xdbert/hub.py": "hub.lock.json"}  # the pins `xdbert fetch` writes: new pins rerun the stage

# ---------------------------------------------------------------------------------------------
# Recording what a stage reads
# ---------------------------------------------------------------------------------------------


class Recorder(dict):
    """A params mapping that logs the key path of every value read from it: a leaf read, a key tested
    (`in`, `get`; a mapping's presence is no read of it), or a mapping's keys listed (iteration, keys, items,
    values: the mapping's path and `*`). A mapping read is a Recorder of its own."""

    def __init__(self, values: dict, log: set[tuple], path: tuple = ()):
        super().__init__(values)
        self.log, self.path = log, path

    def _read(self, key, value):
        if isinstance(value, dict):
            return Recorder(value, self.log, self.path + (key,))
        self.log.add(self.path + (key,))
        return value

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            self.log.add(self.path + (key,))
        return self._read(key, dict.__getitem__(self, key))

    def get(self, key, default=None):
        if dict.__contains__(self, key):
            return self[key]
        self.log.add(self.path + (key,))
        return default

    def __contains__(self, key):
        if not isinstance(dict.get(self, key), dict):  # a section's presence says nothing of its keys
            self.log.add(self.path + (key,))
        return dict.__contains__(self, key)

    def __iter__(self):
        self.log.add(self.path + (ANY,))
        return dict.__iter__(self)

    def keys(self):
        self.log.add(self.path + (ANY,))
        return dict.keys(self)

    def items(self):
        self.log.add(self.path + (ANY,))
        return [(k, self._read(k, v)) for k, v in dict.items(self)]

    def values(self):
        return [v for _, v in self.items()]


def load_stage(script: str):
    """The stage script as a module (its `main` not run)."""
    spec = importlib.util.spec_from_file_location(f"stage_{Path(script).stem}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def profile_values() -> dict[str, dict]:
    """The params of every profile the pipeline runs: embedded, paper, micro and the rehearsal's."""
    out = {name: profiles.values(name) for name in PROFILES}
    out["rehearsal"] = read_yaml_text(rehearsal_params())
    return out


# ---------------------------------------------------------------------------------------------
# The stage templates
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage template of dvc.yaml; `deps` are its data deps (a trailing `# comment` is kept)."""

    script: str
    args: str = ""                 # the command's arguments after the script, in dvc.yaml's syntax
    foreach: str = ""              # `families` or `adapt.variants`: one stage per key
    deps: tuple[str, ...] = ()
    outs: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()  # cache: false (see the docstring)
    plots: tuple[str, ...] = ()    # dvclive folders: x: step, cache: false
    unused: dict[str, str] = field(default_factory=dict)  # a key read but unused -> why it must not rerun the stage


def reasons(section: str, names, why: str) -> dict[str, str]:
    """One reason for several keys of a section."""
    return {f"{section}.{name}": why for name in names}


CHECKED_FAMILIES = {"families.*": "every family's entry is checked (xdbert.model.families); only this stage's own "
                                  "family decides its outputs"}
ADAPT_KEYS = {"adapt.*": "its keys are checked against a variant's overrides; the values used are listed",
              "adapt.variants.*": "every variant's name is checked; only an ablation's own overrides decide its outputs"}
ABLATION_FAMILY = {"adapt.family": "only checked: it names Table 3's family, not this stage's",
                   "families.${adapt.family}": "only checked, as Table 3's family"}
CHECKED_VARIANTS = {"adapt.variants.*": "only checked: `finetune.ablations` names adapt variants"}
CROSS_MODAL = ("clip_heads", "placeholder", "freeze_clip", "clip_tower", "mlm_negatives", "match_prob", "cliptc_prob", "cliptc_vocab")
ADAPT_DEPS = ("data/shards", "models/tokenizer")
MECHANISM_CHECKED = "the mechanism section is checked whole (xdbert.data.mechanism); this stage does not use the key"
# the study's gates and D's replication: only the mechanism stage reads them, so a new replication reruns it alone
MECHANISM_STAGE_ONLY = reasons("mechanism", ("replication", "gates"), MECHANISM_CHECKED)
CLIP_TOWERS = ("models/pretrain_clip", "models/pretrain_clip_nofacts")  # `adapt.clip_tower` may name either
# Only a variant with `adapt.text: captions` reads them, but a foreach template's deps are every item's: DVC
# cannot give one variant a dep of its own (`${item.text}` fails on a variant without the key). With the mechanism
# study on, every ablation reads them anyway, through the CLIP towers trained on them.
CAPTION_TEXT = "data/captions  # whole: captions.json, for a variant with `adapt.text: captions`"

STAGES: dict[str, Stage] = {
    "corpus": Stage(
        "stages/corpus.py", outs=("data/corpus",),
        unused={**reasons("tasks", ("source", "names", "read_path"), "only to check that hand-provided files are there "
                     "(xdbert.data.provided), before any work; the tasks stage reads them"),
                "grounding.captions": "only to check that hand-provided files are there; the grounding stage reads it"}),
    "tasks": Stage(
        "stages/tasks.py", deps=("inputs/commonlit",), outs=("data/tasks",),
        unused={"grounding.captions": "only to check that hand-provided files are there; the grounding stage reads it",
                **MECHANISM_STAGE_ONLY}),
    "dual_tokenize": Stage(
        "stages/dual_tokenize.py", deps=("data/corpus",), outs=("data/shards", "models/tokenizer"),
        unused={"model.encoder_config.*": "a random encoder's config keys are only checked; its max_position_embeddings "
                                          "bounds tokenize.max_len"}),
    "captions": Stage(
        "stages/captions.py", deps=("models/tokenizer", "inputs/coco"), outs=("data/captions",),
        unused={**reasons("mechanism", ("caption_share", "vis", "models", "full_models", "clip_towers", "control_task",
                                        "sentences", "bow_seeds", "replication", "gates"), MECHANISM_CHECKED),
                "tasks.names": "only checked: the mechanism's control task is one of them"}),
    "pretrain_clip": Stage(
        "stages/pretrain_clip.py", deps=(*ADAPT_DEPS, "data/captions"),
        outs=("models/pretrain_clip", "models/pretrain_clip_nofacts"), metrics=("metrics/pretrain_clip.json",),
        unused={**reasons("model", ("encoder", "encoder_config"), "the language encoder's, checked with the model section"),
                **reasons("pretrain", ("mlm_prob", "restate_mask_prob", "max_len"), "the encoder stand-in's: in the "
                       "settings (and the checkpoint's fingerprint), never used by the CLIP tower's training")}),
    "pretrain_encoder": Stage(
        "stages/pretrain_encoder.py", args=KEY, foreach="families", deps=("data/corpus", "models/tokenizer"),
        outs=("models/pretrain_encoder/${key}",), metrics=("metrics/pretrain_encoder/${key}.json",),
        unused=CHECKED_FAMILIES),
    "adapt_baseline": Stage(
        "stages/adapt.py", args=f"{KEY} baseline", foreach="families",
        deps=(*ADAPT_DEPS, "models/pretrain_encoder/${key}"),
        outs=("models/adapted/${key}/baseline", "models/crossmodal/${key}/baseline"),
        metrics=("metrics/adapt/${key}/baseline.json",), plots=("dvclive/adapt/${key}/baseline/plots/metrics",),
        unused={**CHECKED_FAMILIES, **ADAPT_KEYS, **ABLATION_FAMILY,
                **reasons("adapt", CROSS_MODAL, "the baseline has no cross-modal layers, MATCH or CLIPTC")}),
    "adapt": Stage(
        "stages/adapt.py", args=f"{KEY} xdbert", foreach="families",
        deps=(*ADAPT_DEPS, "models/pretrain_encoder/${key}", *CLIP_TOWERS),
        outs=("models/adapted/${key}/xdbert", "models/crossmodal/${key}/xdbert"),
        metrics=("metrics/adapt/${key}/xdbert.json",), plots=("dvclive/adapt/${key}/xdbert/plots/metrics",),
        unused={**CHECKED_FAMILIES, **ADAPT_KEYS, **ABLATION_FAMILY}),
    "ablate": Stage(
        "stages/adapt.py", args=f"{FAMILY} {KEY}", foreach="adapt.variants",
        deps=(*ADAPT_DEPS, "models/pretrain_encoder/${adapt.family}", *CLIP_TOWERS, CAPTION_TEXT),
        outs=("models/adapted/${adapt.family}/${key}", "models/crossmodal/${adapt.family}/${key}"),
        metrics=("metrics/adapt/${adapt.family}/${key}.json",),
        plots=("dvclive/adapt/${adapt.family}/${key}/plots/metrics",),
        unused={**CHECKED_FAMILIES, **ADAPT_KEYS}),
    "finetune": Stage(
        "stages/finetune.py", deps=("data/tasks", "models/tokenizer", "models/adapted", "models/crossmodal",
                                    *CLIP_TOWERS), outs=("results/finetune",),
        unused={**CHECKED_VARIANTS, **MECHANISM_STAGE_ONLY}),
    "aggregate": Stage(
        "stages/aggregate.py", deps=("results/finetune", "metrics/adapt", "results/mechanism.json"),
        outs=("reports/table1.md", "reports/table3.md", "reports/table6.md", "reports/table8.md",
              "results/aggregate.json", "results/aggregate.csv"), metrics=("metrics/tables.json", "metrics/headline.json"),
        unused=CHECKED_VARIANTS),
    "pwcca": Stage(
        "stages/pwcca.py", deps=("models/tokenizer", "models/pretrain_encoder", "models/pretrain_clip"),
        outs=("reports/table2.md",), metrics=("results/pwcca.json",)),
    "grounding": Stage(
        "stages/grounding.py",
        deps=("data/tasks", "models/tokenizer", "data/captions",
              "results/finetune  # whole: `grounding.tasks` may name any classification task"),
        outs=("reports/figure4.png", "reports/figure4.md"), metrics=("results/grounding.json",),
        unused={**CHECKED_FAMILIES, "families.${adapt.family}": "only checked; its name (adapt.family) names the runs"}),
    "mechanism": Stage(
        "stages/mechanism.py",
        deps=("models/pretrain_clip", "models/pretrain_clip_nofacts", "models/pretrain_encoder", "models/adapted",
              "models/crossmodal", "models/tokenizer", "data/tasks", "data/corpus", "data/captions",
              "metrics/adapt  # the caption references' steps and windows: their exposures per fact",
              "results/finetune  # whole: the runs of `mechanism.models`, `full_models` and `clip_towers`",
              "inputs/replications  # whole: the file `mechanism.replication` names is one of them"),
        outs=("reports/mechanism.md",), metrics=("results/mechanism.json",),
        unused={**CHECKED_FAMILIES, "families.${adapt.family}": "only checked; its name (adapt.family) names the models"}),
    "attention": Stage(
        "stages/attention.py",
        deps=("models/crossmodal/${adapt.family}  # whole: `attention.variants` may name any variant",
              "models/tokenizer", "data/tasks", "data/shards"),
        outs=("reports/attention", "reports/attention.md"), metrics=("results/attention.json",),
        unused={**CHECKED_FAMILIES, **ADAPT_KEYS,
                "families.${adapt.family}": "only checked; its name (adapt.family) names the models",
                "adapt.variants": "only checked: which variants have CLIP text (not placeholder) to attend to",
                **reasons("adapt", [f.name for f in fields(AdaptSettings)], "only checked, with the variants")}),
    "probes": Stage(
        "stages/probes.py",
        deps=("models/adapted  # every Table 1 and Table 3 encoder, and the caption-text control",
              "models/crossmodal  # the MLM heads of the baselines and the caption-text control",
              "models/pretrain_clip", "models/tokenizer", "inputs/vicomte  # ViComTe's files: this stage's alone"),
        outs=("reports/probes.md",), metrics=("results/probes.json",),
        unused={"families.*": "only the names: each family's baseline and XDBERT are rows",
                "families.${adapt.family}": "only checked; its name (adapt.family) names Table 3's rows"}),
}


# ---------------------------------------------------------------------------------------------
# Params: recorded, normalized to dvc.yaml's key paths
# ---------------------------------------------------------------------------------------------


def instances(stage: Stage, values: dict) -> list[tuple[tuple[str, ...], dict[tuple, tuple]]]:
    """(the arguments of `read`, {the key path of a foreach item or of Table 3's family: its name in dvc.yaml})
    for every stage the template makes under params `values`."""
    family = values["adapt"]["family"]
    collection = tuple(stage.foreach.split(".")) if stage.foreach else ()
    out = []
    for item in _get(values, collection) if collection else [None]:
        args = tuple(a.replace(KEY, str(item)).replace(FAMILY, family) for a in stage.args.split())
        names = {collection + (item,): collection + (KEY,)} if collection else {}
        names.setdefault(("families", family), ("families", FAMILY))
        out.append((args, names))
    return out


def _get(values: dict, path: tuple):
    for key in path:
        values = values[key]
    return values


def normalize(path: tuple, values: dict, names: dict[tuple, tuple], log: set[tuple]) -> tuple:
    """`path` as dvc.yaml names it. A missing key: which keys the mapping that lacks it has. A foreach item, or
    Table 3's family where the stage reads `adapt.family`: `${key}` or `${adapt.family}`, what is under it the
    item whole. Another item of a collection (a family the stage only checks): the collection's keys."""
    wanted = path[:-1] if path[-1:] == (ANY,) else path
    node, kept = values, ()
    for key in wanted:
        if not isinstance(node, dict) or key not in node:
            break
        node, kept = node[key], kept + (key,)
    keys_read = kept != path
    for item, name in names.items():
        if kept[:len(item)] == item and (name[-1] == KEY or ("adapt", "family") in log):
            return name
    for collection in COLLECTIONS:
        if len(kept) > len(collection) and kept[:len(collection)] == collection:
            return collection + (ANY,)
    return kept + (ANY,) if keys_read else kept


@functools.cache
def recorded(name: str) -> frozenset[tuple]:
    """Every key path template `name` reads, over every profile and every stage it makes, normalized."""
    stage, module = STAGES[name], load_stage(STAGES[name].script)
    out = set()
    for values in profile_values().values():
        for args, names in instances(stage, values):
            log: set[tuple] = set()
            module.read(Recorder(values, log), *args)
            out |= {normalize(path, values, names, log) for path in log}
    return frozenset(out)


def tree(all_values) -> dict:
    """Every profile's keys merged, in document order: what a mapping's children can be."""
    out: dict = {}
    for values in all_values:
        _merge(out, values)
    return out


def _merge(into: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _merge(into.setdefault(key, {}), value)
        else:
            into.setdefault(key, None)


def collapse(paths: set[tuple], keys_tree: dict) -> set[tuple]:
    """The fewest entries that say the same: a mapping every key of which (in some profile) is listed is
    listed whole, and a path under a listed one drops."""
    paths = set(paths)
    for parent in sorted({p[:i] for p in paths for i in range(1, len(p))}, key=len, reverse=True):  # deepest first
        node = _node(keys_tree, parent)
        if node and all(parent + (k,) in paths for k in node):
            paths.add(parent)
    return {p for p in paths if not any(p[:i] in paths for i in range(1, len(p)))}


def _node(keys_tree: dict, path: tuple):
    for key in path:
        if not isinstance(keys_tree, dict) or key not in keys_tree:
            return None
        keys_tree = keys_tree[key]
    return keys_tree if isinstance(keys_tree, dict) else None


def dotted(path: tuple) -> str:
    return ".".join(map(str, path))


def expected_params(name: str, read: frozenset[tuple] | None = None) -> list[str]:
    """Template `name`'s `params:`: what it reads less its unused keys (each with what is under it), in the
    order of the profiles' keys."""
    read = recorded(name) if read is None else read
    unused = STAGES[name].unused
    used = {p for p in read if not any(dotted(p[:i]) in unused for i in range(1, len(p) + 1))}
    keys_tree = tree(profile_values().values())
    kept = collapse({p[:-1] if p[-1] == ANY else p for p in used}, keys_tree)  # DVC: a mapping's keys, the mapping
    return [dotted(p) for p in sorted(kept, key=lambda p: _position(keys_tree, p))]


def _position(keys_tree: dict, path: tuple) -> tuple:
    out = []
    for key in path:
        names = list(keys_tree) if isinstance(keys_tree, dict) else []
        out.append(names.index(key) if key in names else -1)  # ${key}: first under its collection
        keys_tree = keys_tree.get(key) if isinstance(keys_tree, dict) else None
    return tuple(out)


def params_problems(name: str, listed: list[str], read: frozenset[tuple] | None = None) -> list[str]:
    """What is wrong with `listed` as template `name`'s `params:` (empty: exactly what it should be), and
    any unused key the template names that it does not read."""
    read = recorded(name) if read is None else read
    want, unused = expected_params(name, read), STAGES[name].unused
    paths = {dotted(p[:i]) for p in read for i in range(1, len(p) + 1)}
    return ([f"{name} reads {k} but does not list it" for k in want if k not in listed] +
            [f"{name} lists {k}, " + (f"read but unused: {unused[k]}" if k in unused else "which it does not read")
             for k in listed if k not in want] +
            [f"{name} marks {k} unused, but does not read it" for k in unused if k not in paths])


# ---------------------------------------------------------------------------------------------
# Code deps and the file
# ---------------------------------------------------------------------------------------------


def code_deps(script: str) -> list[str]:
    """The script, its modules (sorted) with the files they load, as dvc.yaml lists them."""
    modules = sorted(str(p.relative_to(ROOT)) for p in closure(ROOT / script) if p != ROOT / script)
    out = [script]
    for module in modules:
        out += [module, *([BESIDE[module]] if module in BESIDE else [])]
    return out + [file for module, file in LOADED.items() if module in modules]


def render() -> str:
    lines = ["# Written by tools/dvc_yaml.py from its STAGES: edit there and run `python tools/dvc_yaml.py`.",
             "# Code deps are each script's import closure; params are what its `read` reads (tests/test_params_lists.py).",
             "# Metrics: every JSON result kept in git; metrics/headline.json is what `xdbert compare` shows.",
             "stages:"]
    for name, stage in STAGES.items():
        pad = "      " if stage.foreach else "    "
        lines.append(f"  {name}:")
        if stage.foreach:
            lines += [f"    foreach: ${{{stage.foreach}}}", "    do:"]
        lines.append(f"{pad}cmd: python {stage.script}" + (f" {stage.args}" if stage.args else ""))
        lines += [f"{pad}params:"] + [f"{pad}  - {k}" for k in expected_params(name)]
        lines += [f"{pad}deps:"] + [f"{pad}  - {d}" for d in code_deps(stage.script) + list(stage.deps)]
        lines += [f"{pad}outs:"] + [f"{pad}  - {o}" for o in stage.outs]
        if stage.metrics:
            lines += [f"{pad}metrics:"] + [x for m in stage.metrics for x in (f"{pad}  - {m}:", f"{pad}      cache: false")]
        if stage.plots:
            lines += [f"{pad}plots:"] + [x for m in stage.plots
                                         for x in (f"{pad}  - {m}:", f"{pad}      x: step", f"{pad}      cache: false")]
        lines.append("")
    return "\n".join(lines[:-1]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml differs from what this writes")
    text = render()
    if parser.parse_args().check:
        same = DVC_YAML.read_text(encoding="utf-8") == text
        print("dvc.yaml is up to date" if same else "dvc.yaml differs: run `python tools/dvc_yaml.py`")
        return 0 if same else 1
    io.write_text(DVC_YAML, text)
    print(f"wrote {DVC_YAML.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
