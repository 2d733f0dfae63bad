"""dvc.yaml's `params:` cannot drift: each stage lists exactly the keys its code reads, less the keys it reads
but does not use (each named with its reason in tools/dvc_yaml.py), and dvc.yaml is what that tool writes.

A key a stage reads but does not list would not rerun it when changed (`dvc status` would call stale outputs
up to date); a listed key it never reads reruns it for nothing. What a stage reads is recorded by calling its
`read(p, ...)` on a recording mapping of every profile's values, for every family and variant.
"""
import ast
import functools
import itertools
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from xdbert import params as P
from xdbert import params_check, profiles
from xdbert.adaptation.settings import NOT_SETTINGS, AdaptSettings
from xdbert.errors import PipelineError
from xdbert.imports import closure
from xdbert.model.families import FAMILY_KEYS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import dvc_yaml as D  # noqa: E402


def committed() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def listed(name: str) -> list[str]:
    stage = committed()[name]
    return stage.get("do", stage)["params"]


def test_dvc_yaml_is_what_the_tool_writes():
    assert (ROOT / "dvc.yaml").read_text(encoding="utf-8") == D.render(), \
        "dvc.yaml differs from its definition: run `python tools/dvc_yaml.py`"


def test_the_templates_are_dvc_yamls_stages():
    assert list(committed()) == list(D.STAGES)


@pytest.mark.parametrize("name", list(D.STAGES))
def test_a_stage_lists_exactly_the_params_it_reads(name):
    assert D.params_problems(name, listed(name)) == []


@pytest.mark.parametrize("profile", list(D.profile_values()))
def test_every_listed_param_is_in_the_profile(profile):
    """DVC stops on a `params:` key that params.yaml lacks, so a key is listed only where every profile has it."""
    values = D.profile_values()[profile]
    for name, stage in D.STAGES.items():
        items = list(functools.reduce(dict.get, stage.foreach.split("."), values)) if stage.foreach else [""]
        for item, key in itertools.product(items, listed(name)):
            path = key.replace(D.KEY, item).replace(D.FAMILY, values["adapt"]["family"]).split(".")
            node = values
            for part in path:
                assert isinstance(node, dict) and part in node, f"{name}@{item}: {key} is not in the {profile} profile"
                node = node[part]


def unlisted_key(name: str, keys: list[str]) -> str:
    """A key of the embedded profile that `keys` do not cover: one the stage reads but does not use where it
    has one, else one of a section it reads, else any."""
    def covered(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in keys)

    leaves = [".".join(path) for path, _ in profiles.leaves(profiles.values("embedded"))]
    sections = {k.split(".")[0] for k in keys}
    candidates = ([k for k in D.STAGES[name].unused if k in leaves] +
                  [k for k in leaves if k.split(".")[0] in sections] + leaves)
    return next(k for k in candidates if not covered(k))


@pytest.mark.parametrize("name", list(D.STAGES))
def test_the_check_sees_a_dropped_and_an_added_key(name):
    keys = listed(name)
    dropped, added = keys[-1], unlisted_key(name, keys)
    assert any(dropped in p for p in D.params_problems(name, keys[:-1])), f"dropping {dropped} passed"
    assert any(added in p for p in D.params_problems(name, [*keys, added])), f"adding {added} passed"


def test_the_baseline_does_not_rerun_when_match_prob_changes():
    """It reads every adapt key (the variant's settings), but has no MATCH loss."""
    assert D.params_problems("adapt_baseline", [*listed("adapt_baseline"), "adapt.match_prob"]) == [
        "adapt_baseline lists adapt.match_prob, read but unused: " + D.STAGES["adapt_baseline"].unused["adapt.match_prob"]]


def test_the_recorder_logs_reads_tests_and_listings():
    log = set()
    p = D.Recorder({"a": {"x": 1, "y": {"z": 2}}, "b": 3}, log)
    assert p["a"]["x"] == 1 and "b" in p and p.get("c") is None and "a" in p
    assert log == {("a", "x"), ("b",), ("c",)}  # a section's presence is no read of its keys
    list(p["a"]["y"].items())
    assert log >= {("a", "y", "*"), ("a", "y", "z")}


def test_paths_normalize_to_dvc_yamls_names():
    values = {"adapt": {"family": "bert", "variants": {"mlm": {"losses": ["mlm"]}, "one": {}}},
              "families": {"bert": {"label": "B"}, "electra": {"label": "E"}}, "model": {"clip": "c"}}
    names = {("adapt", "variants", "mlm"): ("adapt", "variants", "${key}"), ("families", "bert"): ("families", "${adapt.family}")}
    log = {("adapt", "family")}
    normalize = lambda path: D.normalize(path, values, names, log)  # noqa: E731
    assert normalize(("adapt", "variants", "mlm", "losses")) == ("adapt", "variants", "${key}")
    assert normalize(("adapt", "variants", "one", "epochs")) == ("adapt", "variants", "*")  # another variant
    assert normalize(("families", "bert", "label")) == ("families", "${adapt.family}")
    assert normalize(("families", "electra", "label")) == ("families", "*")
    assert normalize(("model", "seed")) == ("model", "*")  # missing: which keys `model` has
    assert normalize(("model", "clip")) == ("model", "clip")


def stage_scripts() -> list[Path]:
    return sorted({ROOT / s.script for s in D.STAGES.values()})


@pytest.mark.parametrize("script", stage_scripts(), ids=lambda p: p.name)
def test_main_reads_params_only_through_read(script):
    """What `read` records is all the stage reads: `main` loads params once, straight into `read`, and no
    module the stage runs loads them on its own."""
    def loads(node) -> list[ast.Call]:  # params.load() (the module is imported as `params` or `P`)
        return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "load" and isinstance(n.func.value, ast.Name) and n.func.value.id in ("params", "P")]

    for module in closure(script) - {script}:
        assert not loads(ast.parse(module.read_text(encoding="utf-8"))), f"{module} loads params itself"
    tree = ast.parse(script.read_text(encoding="utf-8"))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    into_read = [c.args[0] for c in ast.walk(functions["main"]) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Name) and c.func.id == "read" and c.args]
    assert loads(functions["main"]) == into_read and len(into_read) == 1, \
        f"{script.name}: main must load params once, straight into read(params.load(), ...)"
    assert not [n for name, f in functions.items() if name != "main" for n in loads(f)], \
        f"{script.name}: only main loads params"


# -- one hand-kept place per key: the key lists and the docs' table are checked against the code -------------

def keys_read_by_the_settings() -> dict[str, set[str]]:
    """Per section, the keys `xdbert check` (every stage's settings, every variant and task) reads in some profile."""
    read: dict[str, set[str]] = {}
    for values in D.profile_values().values():
        log: set[tuple] = set()
        params_check.check(D.Recorder(values, log))
        for path in log:
            depth = 2 if path[0] == "families" else 1  # a family's keys are under its name
            if len(path) > depth and path[depth] != D.ANY:
                read.setdefault(path[0], set()).add(path[depth])
    return read


def test_params_keys_are_the_keys_the_settings_read():
    """Each section's keys (which refuse a misspelt key) may stay a literal: a key in it that no settings object reads,
    or one read that it lacks, fails here. The adapt section is read whole into a variant's settings, so its
    keys are also AdaptSettings' fields and the keys that name runs."""
    read = keys_read_by_the_settings()
    for section, keys in params_check.SECTION_KEYS.items():
        assert read[section] == set(keys or FAMILY_KEYS), section
    assert set(params_check.SECTION_KEYS["adapt"]) == {*NOT_SETTINGS, *(f.name for f in fields(AdaptSettings))}


def readers(section: str) -> str:
    """The stages whose dvc.yaml params hold a key of `section`, as the docs name them."""
    out = []
    for name, stage in committed().items():
        if any(k == section or k.startswith(section + ".") for k in stage.get("do", stage)["params"]):
            out.append(f"`{name}{ {'${families}': '@<family>', '${adapt.variants}': '@<variant>'}.get(stage.get('foreach'), '')}`")
    return ", ".join(out)


def test_the_docs_table_of_keys_is_the_codes():
    text = (ROOT / "docs/profiles.md").read_text(encoding="utf-8").split("## The params sections")[1]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `")]
    table = {row[0].strip("| `"): row for row in rows if len(row) == 4}
    assert list(table) == ["profile", "corpus", "tasks", "mechanism", "hub", "model", "families", "tokenize", "pretrain", "adapt",
                           "finetune", "aggregate", "pwcca", "grounding", "attention", "probes"]
    assert sorted(table) == sorted(["profile", *P.SECTIONS])
    for section, (_, keys, _, read_by) in table.items():
        want = () if section == "profile" else (params_check.SECTION_KEYS[section] or FAMILY_KEYS)
        assert keys == (", ".join(f"`{k}`" for k in want) or "-"), f"docs/profiles.md, `{section}`: keys"
        stages = readers(section) or "no stage"
        assert read_by.removesuffix(" |") == stages or read_by.startswith(stages + "; "), \
            f"docs/profiles.md, `{section}`: read by should be {stages}"


# -- a new key reruns the stages that read its section, and no other --------------------------------------

def key_module(section: str) -> str:
    """The one module that holds `section`'s keys (`<SECTION>_KEYS` at its top level), as dvc.yaml names it."""
    name = f"{section.upper()}_KEYS"
    holders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "xdbert").rglob("*.py"))
               if any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                      for node in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert len(holders) == 1, f"{name} must be defined in one module; found {holders}"
    return holders[0]


def stages_with_dep(path: str) -> set[str]:
    return {name for name, stage in committed().items() if path in stage.get("do", stage)["deps"]}


def readers_of(section: str) -> set[str]:
    """The stages whose dvc.yaml params hold a key of `section`."""
    return {name for name, stage in committed().items()
            if any(k == section or k.startswith(section + ".") for k in stage.get("do", stage)["params"])}


def test_a_sections_keys_are_code_only_of_the_stages_that_read_it():
    """Each section's keys are beside its settings, not in xdbert/params.py (a code dep of every stage), so the
    module holding them is a code dep of the stages that read the section (their `params:` name a key of it)."""
    params_py = ast.parse((ROOT / "xdbert/params.py").read_text(encoding="utf-8"))
    assert not [t.id for node in params_py.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name) and (t.id.endswith("KEYS") or t.id == "KEYS")], "params.py holds no key list"
    for section, keys in params_check.SECTION_KEYS.items():
        if keys is None:  # families: the user's names
            continue
        extra = stages_with_dep(key_module(section)) - readers_of(section)
        assert not extra, \
            f"{key_module(section)}, with the keys of `{section}`, is a code dep of {sorted(extra)}, which do not read it"


def test_a_new_key_in_probes_reruns_the_probes_stage_alone():
    """A new `probes` key: its list (the module holding it) and params.yaml change. dvc.yaml must then call stale
    the `probes` stage and no other: none but it has the module as a code dep or the section whole as a param."""
    assert key_module("probes") == "xdbert/data/probes.py"
    section_whole = {name for name, stage in committed().items() if "probes" in stage.get("do", stage)["params"]}
    assert stages_with_dep(key_module("probes")) | section_whole == {"probes"}
    assert readers_of("probes") == {"probes"}


def test_xdbert_check_refuses_an_unknown_key_of_a_section_a_stage_does_not_read(tmp_path):
    """The corpus stage reads no `probes` key, so it starts with a misspelt one; `xdbert check` (CI) refuses it."""
    path = tmp_path / "params.yaml"
    path.write_text(profiles.render("embedded").replace("  cv_folds: ", "  cv_fold: 5\n  cv_folds: ", 1))
    p = P.load(path)
    assert "cv_fold" in p["probes"]
    D.load_stage("stages/corpus.py").read(p)  # its sections (corpus, mechanism) are fine
    with pytest.raises(PipelineError, match=r"^unknown param `probes.cv_fold` \(did you mean `probes.cv_folds`\?\); "
                                            r"`probes` has: enabled, vicomte_dir, relations, coda_hub_id, reference, cv_folds, n_boot$"):
        params_check.check_file(path)
