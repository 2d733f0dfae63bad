"""The profiles and the switch between them.

`embedded.yaml` holds every default; `paper.yaml` (the paper's setup) and `micro.yaml` (toy sizes for the
tests) hold only what they change (overlays). DVC reads params from `params.yaml` alone, so `xdbert profile
NAME` writes that profile's complete values there, and carries over every value the user changed from the
old profile's defaults.
"""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any, Iterator

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.tokens import CommentToken

from xdbert.params import PROFILES, Loader, read_yaml

PROFILE_DIR = Path(__file__).parent
REPLACE = "!replace"  # an overlay mapping with this tag replaces the default's mapping instead of merging into it


class Replace(dict):
    """A mapping of an overlay that replaces, rather than merges into, the default's mapping."""


class OverlayLoader(Loader):
    pass


OverlayLoader.add_constructor(REPLACE, lambda loader, node: Replace(loader.construct_mapping(node, deep=True)))


def overlay(base: dict, changes: dict) -> dict:
    """`base` with `changes` applied: mappings merge key by key (unless tagged `!replace`), other values replace."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and not isinstance(value, Replace) and isinstance(out.get(key), dict):
            out[key] = overlay(out[key], value)
        else:
            out[key] = plain(value)
    return out


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return copy.deepcopy(value)


def values(name: str) -> dict:
    """The complete params of profile `name`, as `xdbert profile NAME` writes them to params.yaml."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; allowed: {', '.join(PROFILES)}")
    defaults = read_yaml(PROFILE_DIR / "embedded.yaml")
    if name == "embedded":
        return defaults
    with open(PROFILE_DIR / f"{name}.yaml", encoding="utf-8") as f:
        return overlay(defaults, OverlayLoader(f).get_single_data())


def leaves(d: dict, prefix: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(key path, value) of every non-mapping value; an empty mapping is a leaf of its own."""
    for key, value in d.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def user_changes(current: dict, defaults: dict) -> tuple[dict[tuple, Any], list[tuple]]:
    """What the user changed from `defaults`: (changed or added values by key path, key paths removed)."""
    mine, theirs = dict(leaves(current)), dict(leaves(defaults))
    changed = {k: v for k, v in mine.items() if k != ("profile",) and (k not in theirs or theirs[k] != v)}
    removed = [k for k in theirs if k not in mine and not any(k[:i] in mine for i in range(1, len(k)))]
    return changed, removed


def dotted(path: tuple) -> str:
    return ".".join(map(str, path))


# -- rendering params.yaml with the defaults' comments (ruamel.yaml round-trips them, as `dvc exp run -S` does)

def _yaml() -> YAML:
    y = YAML()
    y.width = 4096  # keep every line as written
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def _eol_comment(node: CommentedMap, key: Any) -> str | None:
    token = node.ca.items.get(key, [None, None, None, None])[2]
    return token.value.split("\n", 1)[0] if token is not None and token.value.startswith("#") else None


def _set_eol_comment(node: CommentedMap, key: Any, comment: str | None) -> None:
    """Replace the comment at the end of `key`'s line, keeping the lines that follow it (blank lines and the
    next section's comment); the old comment's indented continuation lines go with it."""
    slot = node.ca.items.get(key)
    token = slot[2] if slot else None
    rest = ""
    if token is not None:
        lines = token.value.split("\n")
        if lines[0].startswith("#"):
            lines = lines[1:]
            while lines and lines[0][:1].isspace() and lines[0].lstrip().startswith("#"):
                lines = lines[1:]
        else:
            lines = lines[1:]
        rest = "\n".join(lines)
    if comment is None and not rest:
        if slot:
            slot[2] = None
        return
    value = (comment or "") + "\n" + rest
    column = token.column if token is not None else 29
    new = CommentToken(value, _Mark(column), None)
    if slot:
        slot[2] = new
    else:
        node.ca.items[key] = [None, None, new, None]


class _Mark:
    def __init__(self, column: int) -> None:
        self.column, self.line = column, 0


def _apply(doc: CommentedMap, changes: CommentedMap) -> None:
    for key, value in changes.items():
        tagged = getattr(value, "tag", None) is not None and getattr(value.tag, "value", None) == REPLACE
        if isinstance(value, CommentedMap) and not tagged and isinstance(doc.get(key), CommentedMap):
            _apply(doc[key], value)
            continue
        doc[key] = _untagged(value)
        _set_eol_comment(doc, key, _eol_comment(changes, key))


def _untagged(value: Any) -> Any:
    """A copy of an overlay mapping without its `!replace` tag, which params.yaml must not carry."""
    if isinstance(value, CommentedMap):
        out = CommentedMap()
        for k, v in value.items():
            out[k] = _untagged(v)
        out.fa.set_flow_style() if value.fa.flow_style() else out.fa.set_block_style()
        return out
    return value


def _set_path(doc: CommentedMap, path: tuple, value: Any, note: str) -> None:
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = CommentedMap()
        node = node[key]
    node[path[-1]] = value
    if isinstance(node, CommentedMap):
        node.fa.set_block_style()  # a comment inside a flow mapping (`{epochs: 2 # ...}`) splits it over two lines
        _set_eol_comment(node, path[-1], f"# {note}")


def render(name: str, changes: dict[tuple, Any] | None = None, note: str = "yours: kept across `xdbert profile`") -> str:
    """params.yaml text for profile `name` with the user's `changes` (key path -> value) applied, each
    marked with the comment `note`."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; allowed: {', '.join(PROFILES)}")
    text = (PROFILE_DIR / "embedded.yaml").read_text(encoding="utf-8")
    if name == "embedded" and not changes:
        return text
    y = _yaml()
    doc = y.load(text)
    if name != "embedded":
        top = y.load((PROFILE_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
        _apply(doc, top)
    for path, value in (changes or {}).items():
        _set_path(doc, path, value, note)
    out = io.StringIO()
    y.dump(doc, out)
    body = out.getvalue().split("\n")
    while body and body[0].startswith("#"):  # the defaults' opening comment names the embedded profile
        body.pop(0)
    source = "the defaults" if name == "embedded" else f"the defaults with xdbert/profiles/{name}.yaml over them"
    return HEADER.format(name=name.upper(), source=source) + "\n".join(body)


HEADER = """\
# Every setting of the pipeline, one section per stage. These values are the {name} profile: {source}
# (xdbert/profiles/), and any changes of yours marked `yours`.
# Change a value here or with `dvc exp run -S key=value`; `xdbert profile NAME` switches profile and keeps
# your changes (docs/profiles.md).
"""
