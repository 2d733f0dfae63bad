"""`xdbert fetch --check` on the rehearsal's tiny mirror: every asset passes as written; each corrupted asset is one
`error:` line naming it, exit 2, nothing written and hub.lock.json byte-identical. And `xdbert fetch` asks the hub
for one weights file per model repository: the one its loader reads."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets
import huggingface_hub
import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from xdbert import fetch, rehearse
from xdbert.cli import app
from xdbert.fetch_check import check_assets
from xdbert.clip import pinned_clip_weights
from xdbert.errors import PipelineError
from xdbert.hub import source
from xdbert.hub_layouts import MODELS
from xdbert.params_check import check_file
from xdbert.profiles import values

PAPER = values("paper")


@pytest.fixture
def out(rehearsal, tmp_path, monkeypatch) -> Path:
    """A copy of the rehearsal folder made of hard links (a corruption replaces a file, never writes into one), its
    hub cache the only one, no network, `datasets`' cache empty."""
    folder = tmp_path / "r"
    shutil.copytree(rehearsal, folder, copy_function=os.link, symlinks=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder / rehearse.CACHE / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.chdir(folder)
    return folder


def tree(folder: Path) -> dict[str, int]:
    return {str(f.relative_to(folder)): f.stat().st_size for f in folder.rglob("*") if f.is_file()}


def replace(path: Path, data: bytes) -> None:
    path.unlink()  # a hard link to the shared mirror: a new file, not a write into it
    path.write_bytes(data)


def snapshot(repo_id: str, repo_type: str = "model") -> Path:
    return Path(source(repo_id, repo_type))


def remove_a_weight(out: Path) -> None:
    path = snapshot("bert-base-uncased") / "model.safetensors"
    weights = load_file(path)
    del weights["bert.encoder.layer.1.output.dense.weight"]
    path.unlink()
    save_file(weights, str(path), metadata={"format": "pt"})


def rename_a_column(out: Path) -> None:
    folder = snapshot("nyu-mll/glue", "dataset")
    for path in sorted((folder / "rte").glob("*.parquet")):
        table = pq.read_table(path)
        path.unlink()
        pq.write_table(table.rename_columns(["premise" if c == "sentence1" else c for c in table.column_names]), path)
    card = folder / "README.md"
    text = card.read_text()
    rte = text.index("config_name: rte")
    replace(card, (text[:rte] + text[rte:].replace("name: sentence1", "name: premise", 1)).encode())


def shuffle_the_labels(out: Path) -> None:
    card = snapshot("nyu-mll/glue", "dataset") / "README.md"
    text = card.read_text()
    names = "'0': entailment\n          '1': neutral\n          '2': contradiction"
    assert names in text
    replace(card, text.replace(names, "'0': contradiction\n          '1': neutral\n          '2': entailment").encode())


def truncate_weights(out: Path) -> None:
    path = snapshot("google/electra-base-discriminator") / "pytorch_model.bin"
    data = path.read_bytes()
    replace(path, data[: len(data) // 2])


def remove_a_hand_provided_file(out: Path) -> None:
    (out / "inputs" / "commonlit" / "train.csv").unlink()


def drop_a_subjects_counts(out: Path) -> None:
    path = out / "inputs" / "vicomte" / "mine-data" / "distributions" / "material-dist.jsonl"
    counts = json.loads(path.read_text())
    del counts["book"]
    replace(path, json.dumps(counts).encode())


def cut_a_coda_distribution(out: Path) -> None:
    path = snapshot("corypaik/coda", "dataset") / "data" / "default_validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["label"] = rows[1]["label"][:10]
    replace(path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def check(out: Path):
    lock, files = (out / "hub.lock.json").read_bytes(), tree(out)
    result = CliRunner().invoke(app, ["fetch", "--check"])
    assert (out / "hub.lock.json").read_bytes() == lock and tree(out) == files  # nothing written
    return result


def test_every_asset_of_the_mirror_passes_in_one_table(out):
    result = check(out)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # hand-provided (ViComTe a row per relation and one for its CoDa templates), corpus, GLUE tasks, SWAG, encoders and
    # CLIP, CoDa, the reference encoder
    assert len(rows) == 2 + 3 + 1 + 1 + 8 + 1 + 4 + 1 + 1
    assert all("| PASS |" in row for row in rows)
    assert "| bert-base-uncased (`model.encoder`) | PASS | bert," in result.output and "MLM head found" in result.output
    assert "no MLM head (electra: absent by design)" in result.output
    assert "= `bert-base-uncased`'s id for id" in result.output
    assert "labels entailment/neutral/contradiction" in result.output
    assert ("| inputs/vicomte color (`probes.vicomte_dir`) | PASS | 12 classes (3 synonyms), 3 templates, counts of 24 "
            "subjects; all train 16, test 8; single train 8, test 4 |") in result.output
    assert "| inputs/vicomte coda (`probes.vicomte_dir`) | PASS | 9 templates for CoDa |" in result.output
    assert "| corypaik/coda (`probes.coda_hub_id`) | PASS | rows (objects): train 20 (6), validation 10 (3), test 10 (3) |" \
        in result.output
    assert "| bert-base-cased (`probes.reference`) | PASS | bert," in result.output


# Each corruption is a whole check of the mirror: the fast tier keeps one of a weights file and one of a hand-provided one
@pytest.mark.parametrize("corrupt, asset, found", [
    (remove_a_weight, "bert-base-uncased (`model.encoder`)", "lacks 1 of its weights (encoder.layer.1.output.dense.weight)"),
    (remove_a_hand_provided_file, "inputs/commonlit/train.csv (`tasks.read_path`)", "missing inputs/commonlit/train.csv"),
    *[pytest.param(*case, marks=pytest.mark.slow) for case in [
        (rename_a_column, "nyu-mll/glue rte (`tasks.glue_hub_id`)", "lacks columns ['sentence1']"),
        (shuffle_the_labels, "nyu-mll/glue mnli (`tasks.glue_hub_id`)",
         "expected label names ['entailment', 'neutral', 'contradiction'] (xdbert.data.tasks.registry), found "
         "['contradiction', 'neutral', 'entailment']"),
        (truncate_weights, "google/electra-base-discriminator (`families.electra-b.encoder`)",
         "expected it to load, found RuntimeError: unexpected EOF"),
        (drop_a_subjects_counts, "inputs/vicomte material (`probes.vicomte_dir`)",
         "inputs/vicomte/mine-data/db/material/train.jsonl, line 3: subject 'book' has no counts in "
         "inputs/vicomte/mine-data/distributions/material-dist.jsonl"),
        (cut_a_coda_distribution, "corypaik/coda (`probes.coda_hub_id`)",
         "data/default_validation.jsonl, line 2: `label` must be 11 non-negative numbers"),
    ]],
])
def test_a_corrupted_asset_is_one_error_line_naming_it_and_the_lock_stays(out, corrupt, asset, found):
    corrupt(out)
    result = check(out)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith(f"error: {asset}: ") and found in errors[0]
    assert f"| {asset} | FAIL |" in result.output and result.output.count("| FAIL |") == 1


def test_a_corpus_whose_titles_the_article_rule_misses_fails(out):
    """wikitext whose train titles lost their ` = ` marks: its articles run together, fewer than its titles."""
    folder = snapshot("Salesforce/wikitext", "dataset")
    for path in sorted(folder.rglob("train-*.parquet")):
        table = pq.read_table(path)
        lines = [line.replace(" = Article", " Article").replace(" = \n", "\n") if line.startswith(" = Article") else line
                 for line in table.column("text").to_pylist()]
        path.unlink()
        pq.write_table(table.set_column(0, "text", pa.array(lines)), path)
    result = check(out)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith("error: Salesforce/wikitext (`corpus.hub_id`): expected one article per title line")


def test_a_failed_check_after_a_download_keeps_the_old_lock(out):
    remove_a_weight(out)
    lock = (out / "hub.lock.json").read_bytes()
    revisions = {e["repo_id"]: e["revision"] for e in json.loads(lock)["assets"]}
    with pytest.raises(PipelineError, match=r"^bert-base-uncased \(`model.encoder`\): language encoder .* lacks 1"):
        fetch.fetch(check_file(out / "params.yaml"), lock=out / "hub.lock.json", resolve=lambda a: revisions[a.repo_id],
                    get=lambda a, r: source(a.repo_id, a.repo_type), say=lambda line: None, check=check_assets)
    assert (out / "hub.lock.json").read_bytes() == lock


@pytest.mark.slow  # the whole rehearsal mirror checked in a clone
def test_the_rehearsal_checks_its_mirror_with_its_own_code_before_dvc_repro(rehearsal, capfd):
    """`xdbert rehearse` runs this check in the clone (the committed code), offline, before `dvc repro`."""
    rehearse.check(rehearsal, say=lambda line: None)
    assert "| timm/vit_base_patch32_clip_224.openai (`model.clip_pretrained`) | PASS |" in capfd.readouterr().out


# ----------------------------------------------------------------------------------------------------
# What `xdbert fetch` downloads
# ----------------------------------------------------------------------------------------------------

def test_fetch_asks_for_the_one_weights_file_each_loader_reads(monkeypatch):
    """Against the record of the real repositories' files: bert-base-uncased's safetensors, not also its `.bin`;
    ELECTRA's `.bin`; CLIP's fp32 safetensors, not its two `.bin` files."""
    asked = {}

    class Api:
        def list_repo_files(self, repo_id, repo_type, revision):
            return [*MODELS[repo_id]["files"], "flax_model.msgpack", "tf_model.h5", "onnx/model.onnx"]

    def snapshot_download(repo_id, repo_type, revision, allow_patterns):
        asked[repo_id] = allow_patterns
        return "folder"

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    models = [a for a in fetch.hub_assets(PAPER) if a.repo_type == "model"]
    for asset in models:
        fetch.download(asset, "e" * 40)
    for repo_id, layout in MODELS.items():
        weights = [f for f in asked[repo_id] if f.endswith((".safetensors", ".bin"))]
        assert weights == [layout["weights"]], repo_id
        assert sorted(asked[repo_id]) == sorted(f for f in layout["files"] if f == layout["weights"] or
                                                not f.endswith((".safetensors", ".bin")))
    datasets_asked = [a for a in fetch.hub_assets(PAPER) if a.repo_type == "dataset"]
    fetch.download(datasets_asked[0], "e" * 40)
    assert asked[datasets_asked[0].repo_id] is None  # a dataset: every file


def test_fetch_picks_the_clip_file_the_tower_reads(out):
    clip = next(a for a in fetch.hub_assets(PAPER) if a.key == "model.clip_pretrained")
    files = sorted(f.name for f in snapshot(clip.repo_id).iterdir())
    model = PAPER["model"]
    assert fetch.wanted_files(clip, files)[-1] == Path(pinned_clip_weights(model["clip"], model["clip_pretrained"])).name


def test_a_repository_without_a_readable_weights_file_is_one_error():
    bert = next(a for a in fetch.hub_assets(PAPER) if a.repo_id == "bert-base-uncased")
    with pytest.raises(PipelineError, match=r"model `bert-base-uncased` \(`model.encoder`\) holds none of the weights "
                                                  r"files its loader reads \(model.safetensors, pytorch_model.bin\)"):
        fetch.wanted_files(bert, ["config.json", "tf_model.h5"])
