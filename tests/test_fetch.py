"""`xdbert fetch` with the hub replaced: which assets it asks for, the lock it writes, loads by the lock from the
cache with no network, and one clear line for each bad input before any download."""
from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from huggingface_hub.file_download import repo_folder_name
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel
from typer.testing import CliRunner

from test_corpus import CONFIG, TRAIN_LINES, write_hub_layout
from xdbert import fetch, hub, mirror_probes
from xdbert.cli import app
from xdbert.data import corpus, provided, vicomte
from xdbert.errors import PipelineError
from xdbert.model.encoders import build_language_encoder
from xdbert.profiles import values

PAPER_ASSETS = [  # (param, repo id, kind): what the paper profile loads from the hub, in stage order
    ("corpus.hub_id", "Salesforce/wikitext", "dataset"),
    ("tasks.glue_hub_id", "nyu-mll/glue", "dataset"),
    ("tasks.swag_hub_id", "allenai/swag", "dataset"),
    ("model.encoder", "bert-base-uncased", "model"),
    ("families.electra-b.encoder", "google/electra-base-discriminator", "model"),
    ("families.electra-l.encoder", "google/electra-large-discriminator", "model"),
    ("model.clip_pretrained", "timm/vit_base_patch32_clip_224.openai", "model"),
    ("probes.coda_hub_id", "corypaik/coda", "dataset"),
    ("probes.reference", "bert-base-cased", "model"),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache of its own, and no network: every hub call must be served from it."""
    folder = tmp_path / "hub-cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return folder


def snapshot(cache: Path, repo_id: str, repo_type: str, revision: str) -> Path:
    """Where the hub cache keeps `repo_id` at commit `revision` (huggingface_hub's own layout)."""
    return cache / repo_folder_name(repo_id=repo_id, repo_type=repo_type) / "snapshots" / revision


CSV = "inputs/commonlit/train.csv"
COCO = "inputs/coco/annotations/captions_train2017.json"


VICOMTE = "inputs/vicomte"


def hand_files(root: Path) -> None:
    """The files the paper profile expects by hand, where it expects them, in their formats (ViComTe's: the mirror's)."""
    for path, text in ((CSV, "id,url_legal,license,excerpt,target,standard_error\na,,,Once upon a time.,-0.3,0.5\n"),
                       (COCO, json.dumps({"annotations": [{"image_id": 1, "caption": "A dog on a red sofa."}]}))):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for relation in vicomte.RELATIONS:
        mirror_probes.write_vicomte(root / VICOMTE, relation, 0, "tiny")
    mirror_probes.write_vicomte_coda(root / VICOMTE)


def test_the_paper_profile_names_its_hub_assets_and_the_embedded_one_none():
    assert [(a.key, a.repo_id, a.repo_type) for a in fetch.hub_assets(values("paper"))] == PAPER_ASSETS
    assert fetch.hub_assets(values("embedded")) == []
    assert provided.files(values("paper")) == [("tasks.read_path", Path(CSV)), ("grounding.captions", Path(COCO))]
    assert fetch.provided_files(values("paper")) == provided.files(values("paper")) + [
        ("probes.vicomte_dir", path) for relation in ("color", "shape", "material") for path in vicomte.files(VICOMTE, relation)
    ] + [("probes.vicomte_dir", Path(VICOMTE, "soft-prompts/prompts/vl/coda.jsonl"))]
    assert fetch.provided_files(values("embedded")) == []


def test_fetch_asks_for_every_asset_and_pins_the_commits_the_hub_gave(cache, tmp_path):
    hand_files(tmp_path)
    p = values("paper")
    p["hub"]["revisions"] = {"bert-base-uncased": "v1.0"}
    asked = []

    def resolve(asset):
        asked.append((asset.repo_id, asset.repo_type, asset.revision))
        return f"{len(asked):040x}"

    def get(asset, revision):
        folder = snapshot(cache, asset.repo_id, asset.repo_type, revision)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        return str(folder)

    lines = []
    checked = []
    entries = fetch.fetch(p, lock=tmp_path / "hub.lock.json", resolve=resolve, get=get, say=lines.append,
                          check=lambda p, say: checked.append(json.loads((tmp_path / "hub.lock.json").read_text())))
    assert checked == [json.loads((tmp_path / "hub.lock.json").read_text())]  # the check read the new pins
    assert asked == [(r, k, "v1.0" if r == "bert-base-uncased" else None) for _, r, k in PAPER_ASSETS]
    lock = json.loads((tmp_path / "hub.lock.json").read_text())
    assert lock == {"profile": "paper", "assets": entries}
    assert [(e["key"], e["repo_id"], e["repo_type"]) for e in entries] == PAPER_ASSETS
    assert [e["revision"] for e in entries] == [f"{i:040x}" for i in range(1, len(PAPER_ASSETS) + 1)]
    assert entries[3]["requested"] == "v1.0" and all(e["files"] == ["config.json"] for e in entries)
    assert lines[-1].startswith(f"{tmp_path / 'hub.lock.json'}: {len(PAPER_ASSETS)} assets pinned")
    # what the loaders read from now on: the pinned snapshot in the cache, with no network
    lock_path = tmp_path / "hub.lock.json"
    assert hub.pinned("bert-base-uncased", lock=lock_path) == f"{4:040x}"
    assert hub.source("bert-base-uncased", lock=lock_path) == str(snapshot(cache, "bert-base-uncased", "model", f"{4:040x}"))
    assert hub.source("nyu-mll/glue", "dataset", lock=lock_path).endswith(f"snapshots/{2:040x}")
    assert hub.source("roberta-base", lock=lock_path) == "roberta-base"  # not pinned: the hub's current one


@pytest.mark.parametrize("text", ['{"old": true}', "not json", '{"assets": [{"repo_id": "bert-base-uncased"}]}',
                                  b"\xbe\xef binary"])
def test_a_damaged_lock_is_one_error_that_says_how_to_restore_it(tmp_path, text):
    lock = tmp_path / "hub.lock.json"
    lock.write_bytes(text) if isinstance(text, bytes) else lock.write_text(text)
    with pytest.raises(PipelineError, match=r"hub.lock.json is not a hub lock .*`git checkout .*`xdbert fetch`"):
        hub.source("bert-base-uncased", lock=lock)
    assert lock.read_bytes() == (text if isinstance(text, bytes) else text.encode())


@pytest.mark.parametrize("change, message", [
    ({"tasks": {"read_path": "inputs/nowhere/train.csv"}}, "missing inputs/nowhere/train.csv (`tasks.read_path`)"),
    ({"grounding": {"captions": "inputs/captions.json"}}, "missing caption file inputs/captions.json (`grounding.captions`)"),
    ({"tasks": {"read_path": "inputs/wrong.csv"}}, "inputs/wrong.csv (`tasks.read_path`) lacks columns ['excerpt', 'target']"),
    ({"grounding": {"captions": "inputs/wrong.json"}}, "inputs/wrong.json is not a COCO captions file"),
    ({"hub": {"revisions": {"roberta-base": "main"}}}, "`hub.revisions` names ['roberta-base'], which these params do not load"),
    ({"hub": {"revisions": {"bert-base-uncased": ""}}}, "`hub.revisions` must map hub ids to a branch, tag or commit"),
])
def test_bad_input_is_one_error_before_any_download_and_keeps_the_old_lock(cache, tmp_path, change, message):
    hand_files(tmp_path)
    (tmp_path / "inputs" / "wrong.csv").write_text("id,text,label\n1,a,0\n")
    (tmp_path / "inputs" / "wrong.json").write_text('{"images": []}')
    p = values("paper")
    for section, keys in change.items():
        p[section].update(keys)
    (tmp_path / "hub.lock.json").write_text('{"old": true}\n')
    calls = []
    with pytest.raises(PipelineError) as e:
        fetch.fetch(p, lock=tmp_path / "hub.lock.json", resolve=lambda a: calls.append(a), get=lambda a, r: calls.append(a),
                    check=lambda p, say: calls.append(p))
    assert message in str(e.value) and calls == []
    assert (tmp_path / "hub.lock.json").read_text() == '{"old": true}\n'


def pin(lock: Path, repo_id: str, repo_type: str, revision: str) -> None:
    entries = json.loads(lock.read_text())["assets"] if lock.is_file() else []
    entries.append({"key": "-", "repo_id": repo_id, "repo_type": repo_type, "requested": None, "revision": revision, "files": []})
    lock.write_text(json.dumps({"profile": "paper", "assets": entries}))


def tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=32))


def test_a_pinned_encoder_and_corpus_load_from_the_cache_without_network(cache, tmp_path):
    sha = "a" * 40
    tiny_bert().save_pretrained(snapshot(cache, "org/tiny-bert", "model", sha))
    write_hub_layout(snapshot(cache, "org/wiki", "dataset", sha))
    pin(tmp_path / "hub.lock.json", "org/tiny-bert", "model", sha)
    pin(tmp_path / "hub.lock.json", "org/wiki", "dataset", sha)
    encoder = build_language_encoder("org/tiny-bert")
    assert all(torch.equal(v, tiny_bert().state_dict()[k]) for k, v in encoder.state_dict().items())
    docs = corpus.load_hub_corpus("org/wiki", CONFIG, cache_dir=str(tmp_path / "datasets"))
    assert docs["train"] == list(corpus.documents_from_lines(TRAIN_LINES))


def test_a_pinned_asset_missing_from_the_cache_says_to_fetch(cache, tmp_path):
    pin(tmp_path / "hub.lock.json", "bert-base-uncased", "model", "b" * 40)
    with pytest.raises(PipelineError, match=r"model `bert-base-uncased` at revision b{40} \(hub.lock.json\) is not in "
                                            r"this machine's hub cache: run `xdbert fetch`"):
        build_language_encoder("bert-base-uncased")


def test_an_encoder_missing_weights_is_an_error_not_a_random_start(cache, tmp_path):
    folder = snapshot(cache, "org/tiny-bert", "model", "c" * 40)
    tiny_bert().save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    dropped = sorted(k for k in weights if "layer.0.attention.self.query" in k)
    save_file({k: v for k, v in weights.items() if k not in dropped}, folder / "model.safetensors", metadata={"format": "pt"})
    pin(tmp_path / "hub.lock.json", "org/tiny-bert", "model", "c" * 40)
    with pytest.raises(PipelineError, match=r"language encoder `org/tiny-bert` lacks 2 of its weights "
                                            r"\(encoder.layer.0.attention.self.query.bias"):
        build_language_encoder("org/tiny-bert")


def test_the_command_writes_the_lock_and_refuses_bad_params_in_one_line(cache, tmp_path):
    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    result = CliRunner().invoke(app, ["fetch"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "hub.lock.json").read_text()) == {"profile": "embedded", "assets": []}
    text = (tmp_path / "params.yaml").read_text().replace("  revisions: {}", "  revisions: [main]")
    (tmp_path / "params.yaml").write_text(text)
    result = CliRunner().invoke(app, ["fetch"])
    assert result.exit_code == 2 and result.output.startswith("error: `hub.revisions` must map hub ids")
    assert len(result.output.strip().splitlines()) == 1


def test_the_first_stage_stops_on_a_missing_hand_provided_file_before_any_work(cache, tmp_path, capsys, monkeypatch):
    """The paper profile with CommonLit's train.csv missing: `corpus`, the first stage, fails in one line
    before it downloads wiki103, and writes nothing."""
    import runpy
    import sys

    import yaml

    hand_files(tmp_path)
    (tmp_path / CSV).unlink()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(values("paper")))
    monkeypatch.setattr(sys, "argv", ["stages/corpus.py"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(Path(__file__).resolve().parents[1] / "stages" / "corpus.py"), run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: missing {CSV} (`tasks.read_path`)")
    assert not (tmp_path / "data").exists()


def test_a_hand_provided_file_outside_inputs_is_read_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    hand_files(tmp_path)
    p = values("paper")
    (tmp_path / "elsewhere.csv").write_text((tmp_path / CSV).read_text())
    p["tasks"]["read_path"] = "elsewhere.csv"
    provided.check_files(provided.files(p))
    assert capsys.readouterr().out.strip() == ("note: elsewhere.csv (`tasks.read_path`) is outside inputs/, which DVC "
                                               "tracks: replacing it will not rerun the stages that read it")
