"""ViComTe's files (Zhang et al., NAACL 2022), provided by hand under `probes.vicomte_dir`, read into plain data.

The layout is the authors' repository's own (github ChenyuHeidiZhang/VL-commonsense @ f111efc), which a user
copies as it is; every line format below was read there, in the data files and in `probing/models.py`
(`load_data`, `load_word_file`, `load_dist_file`, `load_prompts`), which reads them:

- `mine-data/db/<rel>/{train,test}.jsonl` (all groups) and `mine-data/db/<rel>/single/{train,test}.jsonl`: one
  JSON object a line, `{"sub": "pine tree", "obj": "green", "alt": "yellow"}`; `obj` is the subject's top class,
  `alt` one it never has (their code reads `sub` and `obj` only, so do we);
- `mine-data/distributions/<rel>-dist.jsonl`: despite its name, one JSON object (on one line, no newline):
  subject -> Visual Genome counts, one per class, in the classes' order;
- `mine-data/words/<rel>-words.txt`: one word a line, either a class (`blue`) or a synonym folded into one
  (`azure: blue`); the classes, in file order, are the order of the counts (the authors' `WORD_LISTS` in
  probing/models.py are the same words in the same order; the file ends without a newline);
- `soft-prompts/prompts/vl/<rel>.jsonl`: one `{"template": "[X] is made of [Y] ."}` a line, `[X]` the subject and
  `[Y]` the class word; beside them `coda.jsonl`, the same format, the templates of the authors' figures on CoDa
  (`[X]` the object, in its singular where it has one, `[Y]` the colour word: `load_coda_templates`).

Every problem is one `PipelineError` naming the file (and its line) and what is allowed, so a cut-short copy or a
hand-edited line stops the run before any work.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from xdbert.errors import PipelineError

RELATIONS = ("color", "shape", "material")
GROUPS = ("all", "single")   # all object groups (db/<rel>/), and objects of one typical class only (db/<rel>/single/)
SPLITS = ("train", "test")
SUBJECT, TARGET = "[X]", "[Y]"
CODA = "coda"  # the name of ViComTe's CoDa templates file among the relations' templates files

# Each file of a relation, relative to `probes.vicomte_dir`.
FILES = {
    "words": "mine-data/words/{rel}-words.txt",
    "distributions": "mine-data/distributions/{rel}-dist.jsonl",
    "templates": "soft-prompts/prompts/vl/{rel}.jsonl",
    **{f"{group}/{split}": f"mine-data/db/{{rel}}/{'' if group == 'all' else group + '/'}{split}.jsonl"
       for group in GROUPS for split in SPLITS},
}


@dataclass(frozen=True)
class Example:
    sub: str    # the subject ("pine tree")
    obj: str    # its top class ("green")


@dataclass(frozen=True)
class Relation:
    """One ViComTe relation, checked: every `obj` is a class, every subject has its counts."""

    name: str
    classes: tuple[str, ...]                               # in the order of the counts
    synonyms: dict[str, tuple[str, ...]]                   # class -> its words, the class word first
    splits: dict[str, dict[str, tuple[Example, ...]]]      # group (all, single) -> split (train, test) -> examples
    templates: tuple[str, ...]                             # each with one [X] and one [Y]
    distributions: dict[str, tuple[int, ...]]              # subject -> Visual Genome counts, in `classes` order


def files(folder: str | Path, relation: str) -> list[Path]:
    """Every file of `relation` under `folder`, the word list first."""
    return [Path(folder) / path.format(rel=relation) for path in FILES.values()]


def coda_templates_file(folder: str | Path) -> Path:
    """ViComTe's CoDa templates file under `folder`."""
    return Path(folder) / FILES["templates"].format(rel=CODA)


def locate(path: str | Path) -> tuple[Path, str] | None:
    """(the ViComTe folder, the relation, or CODA for the CoDa templates) whose file `path` is, or None."""
    parts = Path(path).parts
    for name, template in [*((r, t) for r in RELATIONS for t in FILES.values()), (CODA, FILES["templates"])]:
        tail = Path(template.format(rel=name)).parts
        if len(parts) > len(tail) and parts[-len(tail):] == tail:
            return Path(*parts[:-len(tail)]), name
    return None


def load_relation(folder: str | Path, relation: str) -> Relation:
    """ViComTe's relation `relation` from its files under `folder`, checked."""
    if relation not in RELATIONS:
        raise PipelineError(f"unknown ViComTe relation {relation!r}; allowed: {', '.join(RELATIONS)}")
    paths = dict(zip(FILES, files(folder, relation)))
    _check_present(folder, paths.values())
    classes, synonyms = read_words(paths["words"])
    distributions = read_distributions(paths["distributions"], classes)
    templates = read_templates(paths["templates"])
    splits: dict[str, dict[str, tuple[Example, ...]]] = {group: {} for group in GROUPS}
    for name in FILES:
        if "/" in name:
            group, split = name.split("/")
            splits[group][split] = read_examples(paths[name], classes, distributions, paths["distributions"])
    return Relation(relation, classes, synonyms, splits, templates, distributions)


def load_coda_templates(folder: str | Path) -> tuple[str, ...]:
    """ViComTe's templates for CoDa from their file under `folder`, checked as a relation's templates are."""
    path = coda_templates_file(folder)
    _check_present(folder, [path])
    return read_templates(path)


def _check_present(folder: str | Path, paths) -> None:
    """A PipelineError naming the first of ViComTe's `paths` that is missing, and how to put them in place."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise PipelineError(f"missing {missing[0]}{f' (and {len(missing) - 1} more ViComTe files)' if len(missing) > 1 else ''}: "
                            f"copy mine-data/ and soft-prompts/ of github ChenyuHeidiZhang/VL-commonsense into {folder} "
                            f"as they are (docs/profiles.md)")


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every non-blank line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path} is not a readable UTF-8 text file: {e}") from e
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _json_line(path: Path, n: int, line: str, keys: tuple[str, ...], example: str) -> dict:
    """Line `n` of a jsonl file: an object with string `keys`."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        row = None
    if not isinstance(row, dict) or any(not isinstance(row.get(k), str) or not row[k].strip() for k in keys):
        raise PipelineError(f"{path}, line {n}: expected a JSON object with the text keys {', '.join(keys)}, like {example}; "
                            f"got {line[:80]!r}")
    return row


def read_words(path: Path) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The classes in file order, and each class's words (itself, then its synonyms): `blue` or `azure: blue`."""
    lines = _lines(path)
    classes = [line for _, line in lines if ":" not in line]
    synonyms = {c: [c] for c in classes}
    seen = set()
    for n, line in lines:
        word, _, target = (part.strip() for part in line.partition(":"))
        if not word or line.count(":") > 1 or (":" in line and target not in synonyms) or word in seen:
            raise PipelineError(f"{path}, line {n}: expected a class word (`blue`) or a synonym and its class (`azure: blue`), "
                                f"each word once; the classes are {', '.join(classes) or 'none'}; got {line!r}")
        seen.add(word)
        if ":" in line:
            synonyms[target].append(word)
    if len(classes) < 2:
        raise PipelineError(f"{path} holds {len(classes)} class words (lines without `:`); a probe needs at least 2")
    return tuple(classes), {c: tuple(words) for c, words in synonyms.items()}


def read_distributions(path: Path, classes: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """One JSON object: subject -> a count per class, in the word list's order."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineError(f"{path} is not one JSON object of subject -> counts: {e}") from e
    if not isinstance(data, dict) or not data:
        raise PipelineError(f"{path} must be one non-empty JSON object of subject -> {len(classes)} counts; got "
                            f"{type(data).__name__}")
    out = {}
    for subject, counts in data.items():
        if (not isinstance(counts, list) or len(counts) != len(classes)
                or any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0 or c != int(c)
                       for c in counts)):
            raise PipelineError(f"{path}, subject {subject!r}: expected {len(classes)} non-negative counts, one per class "
                                f"({', '.join(classes)}); got {str(counts)[:80]}")
        out[subject] = tuple(int(c) for c in counts)
    return out


def read_templates(path: Path) -> tuple[str, ...]:
    """`{"template": ...}` lines, each with one [X] (the subject) and one [Y] (the class word)."""
    out = []
    for n, line in _lines(path):
        template = _json_line(path, n, line, ("template",), '{"template": "[X] is made of [Y] ."}')["template"]
        if template.count(SUBJECT) != 1 or template.count(TARGET) != 1:
            raise PipelineError(f"{path}, line {n}: a template holds {SUBJECT} (the subject) once and {TARGET} (the class "
                                f"word) once; got {template!r}")
        out.append(template)
    if not out:
        raise PipelineError(f"{path} holds no template")
    return tuple(out)


def read_examples(path: Path, classes: tuple[str, ...], distributions: dict[str, tuple[int, ...]],
                  distributions_path: Path) -> tuple[Example, ...]:
    """`{"sub", "obj"}` lines: `obj` one of the classes, `sub` a subject of the distributions."""
    out = []
    for n, line in _lines(path):
        row = _json_line(path, n, line, ("sub", "obj"), '{"sub": "pine tree", "obj": "green", "alt": "yellow"}')
        if row["obj"] not in classes:
            raise PipelineError(f"{path}, line {n}: `obj` {row['obj']!r} is not a class; allowed: {', '.join(classes)}")
        if row["sub"] not in distributions:
            raise PipelineError(f"{path}, line {n}: subject {row['sub']!r} has no counts in {distributions_path}")
        out.append(Example(row["sub"], row["obj"]))
    if not out:
        raise PipelineError(f"{path} holds no examples: every split needs at least one")
    return tuple(out)
