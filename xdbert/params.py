"""Reading `params.yaml` and checking values before any work starts.

Every check raises `PipelineError` naming the full key (`tokenize.max_len`) and what is allowed,
so a typo in `dvc exp run -S ...` fails in a second with a message, not an hour later.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from xdbert.errors import PipelineError

PROFILES = ("embedded", "paper")


class Loader(yaml.SafeLoader):
    """YAML 1.2 floats: PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string, not a number.
    DVC reads params.yaml as YAML 1.2, so `lr: 1e-4` must mean the same number here."""


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
    if not path.is_file():
        raise PipelineError(f"missing {path}: run from the repository root, or `xdbert profile embedded` to write one")
    try:
        params = read_yaml(path) or {}
    except yaml.YAMLError as e:
        raise PipelineError(f"{path} is not valid YAML: {e}") from e
    choice(params.get("profile"), "profile", PROFILES)
    return params


def section(params: dict, name: str) -> dict:
    if not isinstance(params.get(name), dict):
        raise PipelineError(f"params.yaml has no section `{name}`; compare with xdbert/profiles/embedded.yaml (the defaults)")
    return params[name]


def get(sec: dict, key: str, where: str) -> Any:
    if key not in sec:
        raise PipelineError(f"missing param `{where}.{key}`")
    return sec[key]


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
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or value <= 0:
        what = "a positive integer" if kind is int else "a positive number"
        raise PipelineError(f"`{key}` must be {what}; got {value!r}")
    return kind(value)


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):  # YAML's `yes`/`no` are bools already; 0, 1 or "false" are typos
        raise PipelineError(f"`{key}` must be true or false; got {value!r}")
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
