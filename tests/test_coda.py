"""CoDa's data files (xdbert.data.coda) in the hub repository's layout: a line as the authors' export writes it, the
mirror's files (`mirror_probes.write_coda`, from the record of the real layout) read through the pinned snapshot, and each
bad file one `PipelineError` line naming the file and its line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_fetch import cache, pin, snapshot  # noqa: F401  (cache: a fixture)
from xdbert import mirror, mirror_probes
from xdbert.data import coda
from xdbert.errors import PipelineError
from xdbert.hub_layouts import DATASETS

HUB_ID = "corypaik/coda"
LAYOUT = DATASETS[HUB_ID]
# one line in the form `Dataset.to_json(orient="records", lines=True)` writes (pandas escapes "/" as "\/")
LINE = ('{"class_id":"\\/m\\/0k5j","display_name":"Aircraft","ngram":"aircraft","label":[0.0,0.1,0.0,0.4,0.0,0.0,0.0,'
        '0.0,0.0,0.5,0.0],"object_group":1,"text":"Most aircraft are [MASK].","template_group":1,"template_idx":12}\n')


@pytest.fixture
def folder(tmp_path) -> Path:
    out = tmp_path / "coda"
    mirror_probes.write_coda(out, LAYOUT, 0, "tiny")
    return out


def read(folder: Path, tmp_path: Path):
    return coda.read_coda(folder, cache_dir=str(tmp_path / "datasets"))


def test_a_line_of_the_authors_export_reads_as_written(folder, tmp_path):
    coda.data_file(folder, "test").write_text(LINE)
    (row,) = read(folder, tmp_path)["test"]
    assert row == coda.CodaRow("/m/0k5j", "Aircraft", "aircraft", (0.0, 0.1, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0),
                               "Multi", "Most aircraft are [MASK].", "text-masked", 12)
    assert row.label[coda.COLORS.index("white")] == 0.5


def test_the_mirrors_files_load_through_the_pinned_snapshot(cache, tmp_path):  # noqa: F811
    revision = "c" * 40
    folder = snapshot(cache, HUB_ID, "dataset", revision)
    mirror_probes.write_coda(folder, LAYOUT, 0, "tiny")
    mirror.write_placeholders(folder, LAYOUT["files"])
    pin(Path("hub.lock.json"), HUB_ID, "dataset", revision)
    assert sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()) == sorted(
        [*LAYOUT["files"], *LAYOUT["data_files"].values()])
    splits = coda.load_coda(HUB_ID, cache_dir=str(tmp_path / "datasets"))
    assert list(splits) == list(LAYOUT["data_files"])
    for split, rows in splits.items():
        objects = {r.class_id for r in rows}
        # 4 templates an object, 2 for every third object, which has no singular form
        no_singular = len(objects) // mirror_probes.CODA_NO_SINGULAR
        assert len(objects) == mirror_probes.CODA_OBJECTS[split] and len(rows) == len(objects) * 4 - no_singular * 2
        assert all(len(r.label) == len(coda.COLORS) and abs(sum(r.label) - 1) < 1e-4 for r in rows)
        assert {r.template_group for r in rows} == set(coda.TEMPLATE_GROUPS)
        assert all(("[MASK]" in r.text) == (r.template_group == "text-masked") for r in rows)
    assert not {r.class_id for r in splits["train"]} & {r.class_id for r in splits["test"]}


def test_the_loaders_constants_are_the_real_layouts():
    features = dict(LAYOUT["features"])
    assert set(coda.COLUMNS) == set(features)
    assert set(coda.TEXT_COLUMNS) == {name for name, kind in LAYOUT["features"] if kind == "string"}
    assert coda.OBJECT_GROUPS == features["object_group"] and coda.TEMPLATE_GROUPS == features["template_group"]
    assert coda.COLORS == LAYOUT["colors"]
    assert {s: str(coda.data_file(".", s)) for s in coda.SPLITS} == LAYOUT["data_files"]


def edit(path: Path, index: int, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[index] = change(rows[index])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


BAD = {
    "a missing key in one row": ("train", lambda lines_path: edit(lines_path, 3, lambda r: {k: v for k, v in r.items() if k != "text"}),
                                 r"default_train.jsonl, line 4: `text` must be non-empty text"),
    "a column missing from every row": ("validation", lambda p: p.write_text("".join(
        json.dumps({k: v for k, v in json.loads(line).items() if k != "ngram"}) + "\n" for line in p.read_text().splitlines())),
        r"default_validation.jsonl lacks the columns \['ngram'\]; CoDa's rows have class_id, display_name, ngram"),
    "a distribution over ten colours": ("test", lambda p: edit(p, 0, lambda r: {**r, "label": r["label"][:10]}),
                                        r"default_test.jsonl, line 1: `label` must be 11 non-negative numbers, one per "
                                        r"colour \(black, blue,"),
    "a negative share": ("validation", lambda p: edit(p, 2, lambda r: {**r, "label": [-0.1, *r["label"][1:]]}),
                         r"default_validation.jsonl, line 3: `label` must be 11 non-negative numbers"),
    "a group outside the classes": ("train", lambda p: edit(p, 5, lambda r: {**r, "object_group": 3}),
                                    r"default_train.jsonl, line 6: `object_group` must be a class id: 0 Single, 1 Multi, 2 Any"),
    "an empty split": ("test", lambda p: p.write_text("\n"), r"default_test.jsonl holds no rows"),
    "a cut-short line": ("train", lambda p: p.write_text(p.read_text()[:-40]), r"default_train.jsonl is not CoDa's JSON lines"),
    "a missing file": ("validation", lambda p: p.unlink(), r"^missing .*data/default_validation.jsonl: a snapshot of CoDa holds"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_file_is_one_line_naming_it(folder, tmp_path, case):
    split, corrupt, message = BAD[case]
    corrupt(coda.data_file(folder, split))
    with pytest.raises(PipelineError, match=message) as e:
        read(folder, tmp_path)
    assert "\n" not in str(e.value)


def test_the_paper_sized_mirror_has_codas_objects_per_split(tmp_path):
    mirror_probes.write_coda(tmp_path / "coda", LAYOUT, 0, "paper")
    splits = read(tmp_path / "coda", tmp_path)
    objects = {split: {r.class_id for r in rows} for split, rows in splits.items()}
    assert {split: len(ids) for split, ids in objects.items()} == LAYOUT["objects"] == {"train": 311, "validation": 103, "test": 107}
    assert len({r.ngram for rows in splits.values() for r in rows}) == sum(LAYOUT["objects"].values())
    # every object under as many templates of each group as the real templates.yaml, in the export's order
    # (by the template's text, `template_idx` counting over both groups)
    first = [r for r in splits["test"] if r.class_id == splits["test"][0].class_id]
    assert [r.template_idx for r in first] == list(range(20))
    assert {g: sum(r.template_group == g for r in first) for g in coda.TEMPLATE_GROUPS} == LAYOUT["templates"] == {
        "clip-imagenet": 10, "text-masked": 10}
    # objects without a singular form, as in CoDa's files: 13 rows, the templates that need no singular, their
    # template_idx kept, the ngram the plural
    rows = {}
    for r in splits["test"]:
        rows.setdefault(r.class_id, []).append(r)
    assert {len(r) for r in rows.values()} == {20, 13}
    plural = next(r for r in rows.values() if len(r) == 13)
    assert {r.template_idx for r in plural} < set(range(20)) and all(r.ngram.endswith("s") for r in plural)
    assert sum(len(r) == 13 for r in rows.values()) == len(rows) // mirror_probes.CODA_NO_SINGULAR
