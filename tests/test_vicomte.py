"""ViComTe's hand-provided files (xdbert.data.vicomte) in the layout of the authors' repository: the line formats read
as they are written there, the mirror's files (the rehearsal's, written by `mirror_probes.write_vicomte`) loaded whole, and
each bad file one `PipelineError` line naming the file and its line, by the check of the probes stage, which alone
reads them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from xdbert import mirror, mirror_probes
from xdbert.data import provided, vicomte
from xdbert.data.probes import ProbesSettings, check_vicomte_files, vicomte_files
from xdbert.errors import PipelineError
from xdbert.profiles import values


@pytest.fixture
def folder(tmp_path) -> Path:
    """ViComTe's three relations and its CoDa templates as the rehearsal's mirror writes them, under inputs/vicomte."""
    out = tmp_path / "inputs" / "vicomte"
    for relation in vicomte.RELATIONS:
        mirror_probes.write_vicomte(out, relation, 0, "tiny")
    mirror_probes.write_vicomte_coda(out)
    return out


def path_of(folder: Path, name: str, relation: str = "color") -> Path:
    return dict(zip(vicomte.FILES, vicomte.files(folder, relation)))[name]


# ----------------------------------------------------------------------------------------------------
# The real line formats
# ----------------------------------------------------------------------------------------------------

def test_the_authors_line_formats_read_as_written(tmp_path):
    """Lines as the repository's files hold them (f111efc): a word list ending without a newline, synonyms between
    the classes; the counts as one JSON object on one line; `alt` beside `sub` and `obj`."""
    files = dict(zip(vicomte.FILES, vicomte.files(tmp_path, "color")))
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    files["words"].write_text("amber: orange\naqua: blue\nblack\nblue\norange")
    files["distributions"].write_text('{"pine tree": [3, 40, 1], "sign": [52, 9, 7], "clock": [10, 2, 1]}')
    files["templates"].write_text('{"template": "[X] can be of color [Y] ."}\n{"template": "[Y] [X] ."}\n')
    for name in ("all/train", "single/train"):
        files[name].write_text('{"sub": "pine tree", "obj": "blue", "alt": "orange"}\n{"sub": "sign", "obj": "black", "alt": "blue"}\n')
    for name in ("all/test", "single/test"):
        files[name].write_text('{"sub": "clock", "obj": "black", "alt": "orange"}\n')
    r = vicomte.load_relation(tmp_path, "color")
    assert r.classes == ("black", "blue", "orange")  # the lines without `:`, in file order: the counts' order
    assert r.synonyms == {"black": ("black",), "blue": ("blue", "aqua"), "orange": ("orange", "amber")}
    assert r.templates == ("[X] can be of color [Y] .", "[Y] [X] .")
    assert r.distributions == {"pine tree": (3, 40, 1), "sign": (52, 9, 7), "clock": (10, 2, 1)}
    assert r.splits["all"]["train"] == (vicomte.Example("pine tree", "blue"), vicomte.Example("sign", "black"))
    assert r.splits["single"]["test"] == (vicomte.Example("clock", "black"),)


def test_the_mirrors_relations_load_whole(folder):
    for relation in vicomte.RELATIONS:
        r = vicomte.load_relation(folder, relation)
        assert r.classes == mirror_probes.VICOMTE_CLASSES[relation]
        assert {(word, c) for c, words in r.synonyms.items() for word in words[1:]} == set(mirror_probes.VICOMTE_SYNONYMS[relation])
        assert {g: {s: len(rows) for s, rows in split.items()} for g, split in r.splits.items()} == mirror_probes.VICOMTE_ROWS
        examples = [e for split in r.splits.values() for rows in split.values() for e in rows]
        assert all(r.distributions[e.sub][r.classes.index(e.obj)] == max(r.distributions[e.sub]) for e in examples)
        assert len({e.obj for e in r.splits["all"]["train"]}) >= 2  # a classifier needs two classes
        assert all(t.count("[X]") == t.count("[Y]") == 1 for t in r.templates)


def test_the_mirror_has_the_real_files_quirks(folder):
    """What the real files (f111efc) have, made up in their shapes: the word list in alphabetical order with the
    synonyms interleaved ("amber: orange" first) and no final newline, nor in the templates; a shape class in test
    alone (polygon, one subject, in both groupings' test splits) and classes no subject has (semicircle, jade);
    subjects whose counts tie `obj` with another class at the top; the majority class far ahead (shape: round)."""
    words = path_of(folder, "words").read_text(encoding="utf-8")
    assert words.splitlines()[:3] == ["amber: orange", "azure: blue", "black"] and not words.endswith("\n")
    assert words.splitlines() == sorted(words.splitlines(), key=lambda line: line.split(":")[0])
    assert not path_of(folder, "templates").read_text(encoding="utf-8").endswith("\n")
    shape = vicomte.load_relation(folder, "shape")
    for grouping, splits in shape.splits.items():
        train, test = ({e.obj for e in splits[s]} for s in ("train", "test"))
        assert [e.obj for e in splits["test"]].count("polygon") == 1 and "polygon" not in train, grouping
        assert "semicircle" not in train | test
    material = vicomte.load_relation(folder, "material")
    assert "jade" in material.classes and "jade" not in {e.obj for s in material.splits["all"].values() for e in s}
    ties = 0
    for relation in vicomte.RELATIONS:
        r = vicomte.load_relation(folder, relation)
        for e in (e for s in r.splits["all"].values() for e in s):
            counts = r.distributions[e.sub]
            ties += counts.count(max(counts)) > 1 and r.classes[counts.index(max(counts))] != e.obj
    assert ties >= 3  # in every relation's files, the counts' first top class another than `obj`
    objs = [e.obj for e in shape.splits["all"]["train"]]
    assert max(set(objs), key=objs.count) == "round" and objs.count("round") / len(objs) > 0.5


def test_the_mirrors_coda_templates_load_in_the_real_files_shape(folder):
    """As many as ViComTe's coda.jsonl holds, the line format of a relation's templates, no final newline."""
    path = vicomte.coda_templates_file(folder)
    assert path == folder / "soft-prompts/prompts/vl/coda.jsonl"
    assert not path.read_text(encoding="utf-8").endswith("\n")
    assert vicomte.load_coda_templates(folder) == mirror_probes.VICOMTE_CODA_TEMPLATES
    assert len(mirror_probes.VICOMTE_CODA_TEMPLATES) == 9


def test_the_paper_sized_mirror_has_the_real_files_sizes_and_loads_whole(tmp_path):
    """`--sizes paper` (bench/probes_stage.py times the probes on it): the real examples per group and split and 7
    templates per relation (../shared/PROBES.md), distinct subjects, the single group's objects among all groups',
    every class an `obj` somewhere but those of no subject in the real files (semicircle, jade), the majority classes
    near their real shares."""
    for relation in vicomte.RELATIONS:
        mirror_probes.write_vicomte(tmp_path, relation, 0, "paper")
        r = vicomte.load_relation(tmp_path, relation)
        assert {g: {s: len(rows) for s, rows in split.items()} for g, split in r.splits.items()} == mirror_probes.VICOMTE_PAPER_ROWS[relation]
        assert len(r.templates) == 7 and all(t.count("[X]") == t.count("[Y]") == 1 for t in r.templates)
        every = [e for rows in r.splits["all"].values() for e in rows]
        assert len({e.sub for e in every}) == len(every) == len(r.distributions)
        assert {e for rows in r.splits["single"].values() for e in rows} <= set(every)
        assert {e.obj for e in every} == set(r.classes) - set(mirror_probes.VICOMTE_NEVER.get(relation, ()))
        majority, share = mirror_probes.VICOMTE_MAJORITY[relation]
        test = [e.obj for e in r.splits["all"]["test"]]
        assert test.count(majority) / len(test) == pytest.approx(share, abs=0.06)

def test_a_file_is_located_by_its_path(folder):
    for relation in vicomte.RELATIONS:
        assert {vicomte.locate(p) for p in vicomte.files(folder, relation)} == {(folder, relation)}
    assert vicomte.locate(Path("inputs/vicomte/mine-data/db/shape/single/test.jsonl")) == (Path("inputs/vicomte"), "shape")
    assert vicomte.locate(Path("inputs/vicomte/soft-prompts/prompts/vl/coda.jsonl")) == (Path("inputs/vicomte"), vicomte.CODA)
    assert vicomte.locate(Path("inputs/commonlit/train.csv")) is None


# ----------------------------------------------------------------------------------------------------
# Bad files: one line naming the file (and line) and what is allowed
# ----------------------------------------------------------------------------------------------------

def rewrite(path: Path, change) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(change(lines)) + "\n")


def set_line(index: int, row: dict):
    return lambda lines: lines[:index] + [json.dumps(row)] + lines[index + 1:]


BAD = {
    "missing key": ("all/train", set_line(1, {"sub": "ball", "alt": "red"}),
                    r"mine-data/db/color/train.jsonl, line 2: expected a JSON object with the text keys sub, obj"),
    "not JSON": ("all/test", lambda lines: lines + ['{"sub": "kite", "obj": '],
                 r"mine-data/db/color/test.jsonl, line 9: expected a JSON object"),
    "attribute outside the classes": ("single/train", set_line(0, {"sub": "kite", "obj": "teal", "alt": "red"}),
                                      r"mine-data/db/color/single/train.jsonl, line 1: `obj` 'teal' is not a class; "
                                      r"allowed: black, blue, brown, gray, green, orange, pink, purple, red, silver, white, yellow"),
    "empty split": ("single/test", lambda lines: [], r"mine-data/db/color/single/test.jsonl holds no examples"),
    "template without [X]": ("templates", set_line(0, {"template": "the color is [Y] ."}),
                             r"prompts/vl/color.jsonl, line 1: a template holds \[X\] \(the subject\) once and \[Y\]"),
    "template without [Y]": ("templates", set_line(2, {"template": "a [X] ."}),
                             r"prompts/vl/color.jsonl, line 3: a template holds \[X\]"),
    "subject missing from the distributions": (
        "distributions", lambda lines: [json.dumps({k: v for k, v in json.loads(lines[0]).items() if k != "ball"})],
        r"mine-data/db/color/train.jsonl, line 2: subject 'ball' has no counts in .*mine-data/distributions/color-dist.jsonl"),
    "counts of another length": (
        "distributions", lambda lines: [json.dumps({**json.loads(lines[0]), "kite": [1, 2, 3]})],
        r"color-dist.jsonl, subject 'kite': expected 12 non-negative counts, one per class \(black, blue,"),
    "synonym of no class": ("words", lambda lines: lines + ["teal: cyan"],
                            r"mine-data/words/color-words.txt, line 16: expected a class word .* the classes are black, "),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_one_line_naming_it(folder, case):
    name, change, message = BAD[case]
    rewrite(path_of(folder, name), change)
    with pytest.raises(PipelineError, match=message) as e:
        vicomte.load_relation(folder, "color")
    assert "\n" not in str(e.value)
    vicomte.load_relation(folder, "shape")  # another relation's files are untouched


def test_a_missing_file_names_it_and_where_the_files_come_from(folder):
    path_of(folder, "words", "material").unlink()
    path_of(folder, "single/test", "material").unlink()
    with pytest.raises(PipelineError, match=r"^missing .*mine-data/words/material-words.txt \(and 1 more ViComTe files\): "
                                            r"copy mine-data/ and soft-prompts/ of github ChenyuHeidiZhang/VL-commonsense"):
        vicomte.load_relation(folder, "material")


# ----------------------------------------------------------------------------------------------------
# The params section and the check of the probes stage
# ----------------------------------------------------------------------------------------------------

def test_the_probes_are_on_in_the_paper_profile_only():
    assert ProbesSettings.from_params(values("paper")) == ProbesSettings(
        True, Path("inputs/vicomte"), ("color", "shape", "material"), "corypaik/coda", "bert-base-cased", 5, 1000)
    for profile in ("embedded", "micro"):
        assert not ProbesSettings.from_params(values(profile)).enabled
        assert vicomte_files(ProbesSettings.from_params(values(profile))) == []


def test_only_the_relations_named_are_checked(folder, monkeypatch):
    monkeypatch.chdir(folder.parents[1])
    p = values("paper")
    p["probes"]["relations"] = ["shape"]
    path_of(folder, "words", "color").unlink()
    assert vicomte_files(ProbesSettings.from_params(p)) == [
        (provided.VICOMTE, path) for path in [*vicomte.files("inputs/vicomte", "shape"), vicomte.coda_templates_file("inputs/vicomte")]]
    check_vicomte_files(ProbesSettings.from_params(p))


def test_a_bad_vicomte_file_is_refused_by_the_check_of_the_stage_that_reads_it(folder, monkeypatch):
    """The probes stage checks ViComTe's files when it starts (`check_vicomte_files`); the first stage, which
    does not read them, no longer does: it starts on a bad one."""
    root = folder.parents[1]
    monkeypatch.chdir(root)
    p = values("paper")
    rewrite(path_of(folder, "all/test", "shape"), set_line(0, {"sub": "kite", "obj": "teal", "alt": "star"}))
    with pytest.raises(PipelineError, match=r"^inputs/vicomte/mine-data/db/shape/test.jsonl, line 1: `obj` 'teal' is not a class"):
        check_vicomte_files(ProbesSettings.from_params(p))
    mirror.write_inputs(p, root, "tiny")  # CommonLit and COCO beside ViComTe's
    provided.check_files(provided.files(p))


def test_a_bad_line_of_the_coda_templates_is_one_error_naming_it(folder, monkeypatch):
    """ViComTe's CoDa templates are checked by the probes stage's check with its other files, line by line."""
    monkeypatch.chdir(folder.parents[1])
    s = ProbesSettings.from_params(values("paper"))
    path = vicomte.coda_templates_file("inputs/vicomte")
    rewrite(path, set_line(3, {"template": "most things are [Y] ."}))
    with pytest.raises(PipelineError, match=r"^inputs/vicomte/soft-prompts/prompts/vl/coda.jsonl, line 4: a template holds "
                                            r"\[X\] \(the subject\) once and \[Y\]") as e:
        check_vicomte_files(s)
    assert "\n" not in str(e.value)
    rewrite(path, set_line(1, {"text": "[X] are [Y] ."}))
    with pytest.raises(PipelineError, match=r"^inputs/vicomte/soft-prompts/prompts/vl/coda.jsonl, line 2: expected a JSON "
                                            r"object with the text keys template"):
        check_vicomte_files(s)


def test_the_coda_templates_missing_are_named_by_the_check(folder, monkeypatch):
    monkeypatch.chdir(folder.parents[1])
    vicomte.coda_templates_file("inputs/vicomte").unlink()
    with pytest.raises(PipelineError, match=r"^missing inputs/vicomte/soft-prompts/prompts/vl/coda.jsonl: copy mine-data/ "
                                            r"and soft-prompts/ of github ChenyuHeidiZhang/VL-commonsense into inputs/vicomte"):
        check_vicomte_files(ProbesSettings.from_params(values("paper")))
