"""Reading `params.yaml` and checking values before any work starts.

Every check raises `PipelineError` naming the full key (`tokenize.max_len`) and what is allowed,
so a typo in `dvc exp run -S ...` fails in a second with a message, not an hour later.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from xdbert.errors import PipelineError

PROFILES = ("embedded", "paper", "micro")

# Every section params.yaml may hold, so that a typo (`finetunes`) stops every stage at once. Each section's keys
# are beside its settings (`CORPUS_KEYS`, ...), checked when those are built: a stage depends on the key lists of the
# sections it reads alone, and `xdbert check` gathers them all (xdbert.params_check.SECTION_KEYS).
SECTIONS = ("corpus", "tasks", "mechanism", "model", "families", "hub", "tokenize", "pretrain", "adapt", "pwcca",
            "grounding", "attention", "finetune", "aggregate", "probes")


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML 1.2 floats: PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string, not a number.
    DVC reads params.yaml as YAML 1.2, so `lr: 1e-4` must mean the same number here. libyaml's parser
    where PyYAML has it: the pure-Python one took 0.14 s for a params file, more than the check it feeds."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(path: Path) -> Any:
    return read_yaml_text(path.read_text(encoding="utf-8"))


def read_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=Loader)


def load(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if path.is_dir():
        raise PipelineError(f"{path} is a folder; give the params file (params.yaml)")
    if not path.is_file():
        raise PipelineError(f"missing {path}: run from the repository root, or `xdbert profile embedded` to write one")
    try:
        params = read_yaml(path) or {}
    except yaml.YAMLError as e:
        raise PipelineError(f"{path} is not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise PipelineError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): a params file is YAML; "
                            "`xdbert profile embedded` writes a whole one") from e
    if not isinstance(params, dict):
        raise PipelineError(f"{path} must be a mapping of sections (profile, corpus, tasks, ...); got {type(params).__name__}")
    if "profile" not in params:  # an empty file, or one written by hand
        raise PipelineError(f"{path} has no `profile` key; allowed: {', '.join(PROFILES)} (`xdbert profile embedded` "
                            "writes a whole params file)")
    choice(params.get("profile"), "profile", PROFILES)
    for name in params:
        if name != "profile" and name not in SECTIONS:
            raise PipelineError(f"unknown section `{name}` in {path}{_closest(name, SECTIONS)}; allowed: profile, {', '.join(SECTIONS)}")
    return params


def check_keys(sec: dict, name: str, keys: tuple[str, ...]) -> None:
    """Refuse a key of section `name` that no stage reads (`adapt.lrr`), naming the closest of its `keys`. Only the
    names are looked at, through dict's own `keys`: which keys a section has decides nothing a stage computes, so
    tools/dvc_yaml.py's Recorder must not count this as a read of the section whole."""
    for key in dict.keys(sec):
        if key not in keys:
            raise PipelineError(f"unknown param `{name}.{key}`{_closest(key, keys, name + '.')}; `{name}` has: {', '.join(keys)}")


def _closest(word: str, known, prefix: str = "") -> str:
    match = difflib.get_close_matches(str(word), list(known), n=1)
    return f" (did you mean `{prefix}{match[0]}`?)" if match else ""


def section(params: dict, name: str, keys: tuple[str, ...] | None = None) -> dict:
    """Section `name` of `params`, a mapping; with `keys` (the section's own settings build from it), also every
    key in it known (`check_keys`)."""
    if name not in params:
        raise PipelineError(f"params.yaml has no section `{name}`; compare with xdbert/profiles/embedded.yaml (the defaults)")
    if not isinstance(params[name], dict):
        raise PipelineError(f"section `{name}` of params.yaml must map its keys to values; got {type(params[name]).__name__}: "
                            f"compare with xdbert/profiles/embedded.yaml (the defaults)")
    if keys is not None:
        check_keys(params[name], name, keys)
    return params[name]


def get(sec: dict, key: str, where: str) -> Any:
    if key not in sec:
        raise PipelineError(f"missing param `{where}.{key}`")
    return sec[key]


def getter(sec: dict, where: str) -> Callable[[str], Any]:
    """`get(key)` for one section: its value, or a `PipelineError` naming `where.key` when it is missing."""
    return lambda key: get(sec, key, where)


def choice(value: Any, key: str, allowed: Iterable[Any]) -> Any:
    allowed = list(allowed)
    if value not in allowed:
        raise PipelineError(f"unknown {key} {value!r}; allowed: {', '.join(map(str, allowed))}")
    return value


def subset(values: Any, key: str, allowed: Iterable[Any], nonempty: bool = True) -> list:
    allowed = list(allowed)
    if not isinstance(values, (list, tuple)):
        raise PipelineError(f"`{key}` must be a list drawn from: {', '.join(map(str, allowed))}; got {values!r}")
    if nonempty and not values:
        raise PipelineError(f"`{key}` is empty; give at least one of: {', '.join(map(str, allowed))}")
    for v in values:
        choice(v, f"entry of `{key}`", allowed)
    return list(values)


def positive(value: Any, key: str, kind: type = int) -> Any:
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and math.isfinite(value))
    if kind is int:  # 2.0 is 2; YAML's .inf and .nan are no sizes, nor rates
        ok = ok and (isinstance(value, int) or value.is_integer())
    if not ok or value <= 0:
        what = "a positive integer" if kind is int else "a positive number"
        raise PipelineError(f"`{key}` must be {what}; got {value!r}")
    return kind(value)


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):  # YAML's `yes`/`no` are bools already; 0, 1 or "false" are typos
        raise PipelineError(f"`{key}` must be true or false; got {value!r}")
    return value


def compile_setting(value: Any, key: str) -> bool | str:
    """`compile`: true, false or auto (compiled on a GPU, where it pays, and eager on a CPU, where
    compiling a model costs minutes that its short runs never win back)."""
    if value != "auto" and not isinstance(value, bool):
        raise PipelineError(f"`{key}` must be true, false or auto (on a GPU only); got {value!r}")
    return value


def fraction(value: Any, key: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise PipelineError(f"`{key}` must be a number between 0 and 1; got {value!r}")
    return float(value)


def nonempty_str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PipelineError(f"`{key}` must be a non-empty string; got {value!r}")
    return value


def non_negative(value: Any, key: str) -> int:
    """A non-negative integer, such as a seed (0 allowed, unlike `positive`)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PipelineError(f"`{key}` must be a non-negative integer; got {value!r}")
    return value


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a stage's `@<name>`, a folder and a params key: no dots, no slashes
BASELINE = "baseline"   # the MLM-only adaptation of every family (`adapt.baseline`)
PROPOSED = "xdbert"     # the proposed adaptation of every family: the `adapt` defaults as they are


def names(value: Any, key: str, what: str = "names") -> list[str]:
    """A list of distinct plain names (NAME: a model, a task, a tower), checked; `what` says which kind."""
    if not isinstance(value, list) or not all(isinstance(v, str) and NAME.fullmatch(v) for v in value):
        raise PipelineError(f"`{key}` must be a list of {what}; got {value!r}")
    if len(set(value)) != len(value):
        raise PipelineError(f"`{key}` lists a name twice: {value}")
    return value

def variant_names(params: dict) -> list[str]:
    """The names of `adapt.variants` (the ablations), checked. A name is a stage (`ablate@<name>`) and a
    folder (models/adapted/<family>/<name>), so a plain word, and never `baseline` or `xdbert`, the
    adaptations every family has."""
    variants = get(section(params, "adapt"), "variants", "adapt")
    if not isinstance(variants, dict):
        raise PipelineError(f"`adapt.variants` must map variant names to the adapt keys they change, e.g. "
                            f"{{mlm: {{losses: [mlm]}}}}; got {variants!r}")
    for name in variants:
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in (BASELINE, PROPOSED):
            raise PipelineError(f"`adapt.variants` has the name {name!r}: a variant's name must be letters, digits, _ and - "
                                f"(it names the stage ablate@<name> and its folders), and not `{BASELINE}` or `{PROPOSED}` "
                                f"(every family's own adaptations)")
    return list(variants)
