"""`xdbert rehearse`: the tiny hub mirror it builds loads through the paper profile's own loaders, offline, under
the real ids and the revisions its lock records; its params differ from the paper profile in counts only."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
import torch
from huggingface_hub.file_download import repo_folder_name
from typer.testing import CliRunner

from xdbert import hub, numerics, params, profiles, rehearse
from xdbert.cli import app
from xdbert.data import provided
from xdbert.data.tasks.hub import GLUE, load_glue, load_read, load_swag
from xdbert.data.tasks.registry import get_task
from xdbert.mirror import ROWS, TINY


@pytest.fixture
def offline(rehearsal, tmp_path, monkeypatch) -> dict:
    """Inside the rehearsal folder, its hub cache the only one, no network; the lock it wrote."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(rehearsal / rehearse.CACHE / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.chdir(rehearsal)
    return json.loads((rehearsal / "hub.lock.json").read_text())


def test_every_asset_is_pinned_at_a_made_up_commit_in_the_real_layout(rehearsal, offline):
    assert "NOT the hub's commits" in offline["rehearsal"]
    names = [(a["key"], a["repo_id"]) for a in offline["assets"]]
    assert names == [("corpus.hub_id", "Salesforce/wikitext"), ("tasks.glue_hub_id", "nyu-mll/glue"),
                     ("tasks.swag_hub_id", "allenai/swag"), ("model.encoder", "bert-base-uncased"),
                     ("families.electra-b.encoder", "google/electra-base-discriminator"),
                     ("families.electra-l.encoder", "google/electra-large-discriminator"),
                     ("model.clip_pretrained", "timm/vit_base_patch32_clip_224.openai"),
                     ("probes.coda_hub_id", "corypaik/coda"), ("probes.reference", "bert-base-cased")]
    for a in offline["assets"]:
        repo = rehearsal / rehearse.CACHE / "hub" / repo_folder_name(repo_id=a["repo_id"], repo_type=a["repo_type"])
        assert len(a["revision"]) == 40 and int(a["revision"], 16) >= 0
        assert (repo / "refs" / "main").read_text() == a["revision"]
        assert hub.source(a["repo_id"], a["repo_type"]) == str(repo / "snapshots" / a["revision"])
        assert sorted(str(f.relative_to(repo / "snapshots" / a["revision"]))
                      for f in (repo / "snapshots" / a["revision"]).rglob("*") if f.is_file()) == a["files"]


def test_encoders_load_with_real_vocabulary_and_tiny_shapes(offline):
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.model.encoders import build_language_encoder, load_pretrained_mlm_head
    from xdbert.model.layers import MaskedTokenHead

    tok = load_encoder_tokenizer("bert-base-uncased")
    assert len(tok) == 30522 and tok.tokenize("Unaffable") == ["una", "##ffa", "##ble"]
    bert = build_language_encoder("bert-base-uncased")  # refuses a checkpoint with missing weights
    assert (bert.config.model_type, bert.config.hidden_size, bert.config.num_hidden_layers) == ("bert", TINY["hidden_size"], 2)
    assert bert.config.vocab_size == 30522 and bert.config.max_position_embeddings == 512
    head = MaskedTokenHead(bert.config.hidden_size, bert.get_input_embeddings())
    assert load_pretrained_mlm_head("bert-base-uncased", head)  # BERT's MLM head, from the pretraining checkpoint
    electra = build_language_encoder("google/electra-base-discriminator")
    assert electra.config.model_type == "electra" and electra.config.hidden_size == TINY["hidden_size"]
    # random, but not the same random weights: Table 2 compares the two
    assert not torch.equal(bert.get_input_embeddings().weight, electra.get_input_embeddings().weight)
    assert len(load_encoder_tokenizer("google/electra-base-discriminator")) == 30522


def test_clip_loads_the_pinned_openai_weights(offline):
    from xdbert.clip import pinned_clip_weights
    from xdbert.model.clip_tower import CLIPTextTower

    weights = pinned_clip_weights("ViT-B-32", "openai")
    assert weights.startswith(hub.source("timm/vit_base_patch32_clip_224.openai")) and weights.endswith(".safetensors")
    tower = CLIPTextTower.build("ViT-B-32", "openai")  # require_pretrained: a strict load of the whole CLIP
    assert (tower.width, tower.context_length) == (512, 77)


def test_dataset_slices_load_through_the_paper_loaders_in_their_schemas(rehearsal, offline):
    from xdbert.data.corpus import load_hub_corpus

    p = params.load(rehearsal / "params.yaml")
    docs = load_hub_corpus(p["corpus"]["hub_id"], p["corpus"]["hub_config"])
    assert docs["train"] and docs["valid"] and all("=" not in d.split("\n")[0] for d in docs["train"])
    for task in [t for t in p["tasks"]["names"] if t in GLUE]:
        splits = load_glue(task, p["tasks"]["glue_hub_id"])
        assert set(splits) == set(get_task(task).splits)  # the unlabeled test splits are dropped
        assert splits["train"].num_rows == ROWS["train"]
        ds = datasets.load_dataset(hub.source(p["tasks"]["glue_hub_id"], "dataset"), task, split="train")
        label = ds.features["label"]
        spec = get_task(task)
        assert (label.names == list(spec.label_names)) if spec.label_names else label.dtype == "float32"
        assert ds.features["idx"].dtype == "int32"
    swag = load_swag(p["tasks"]["swag_hub_id"])
    assert [len(c) for c in swag["dev"].column("choices").to_pylist()] == [4] * ROWS["dev"]
    read = load_read(p["tasks"]["read_path"])
    assert read["train"].num_rows + read["dev"].num_rows == ROWS["train"] + ROWS["dev"]
    provided.check_files(provided.files(p))  # the CSV's header and COCO's captions, as the `corpus` stage checks them


def test_the_clone_runs_its_own_code_with_mkls_zen_kernels(rehearsal):
    """DIR's code comes first on the path; the library the install built (not in git) came along."""
    code = "import xdbert, torch; from xdbert import numerics; print(xdbert.__file__, numerics.mkl_path())"
    ran = subprocess.run([sys.executable, "-c", code], cwd=rehearsal, env=rehearse.offline_env(rehearsal),
                         capture_output=True, text=True, check=True).stdout.split()
    assert ran == [str(rehearsal.resolve() / "xdbert/__init__.py"), "zen" if numerics.X86_64 else "vendor"]


def test_params_differ_from_the_paper_profile_in_the_listed_counts_only(rehearsal):
    written = dict(profiles.leaves(params.load(rehearsal / "params.yaml")))
    paper = dict(profiles.leaves(profiles.values("paper")))
    assert set(written) == set(paper)
    changed = {profiles.dotted(k): v for k, v in written.items() if v != paper[k]}
    assert changed == rehearse.OVERRIDES
    assert "rehearsal" in (rehearsal / "params.yaml").read_text()


def test_help_lists_the_overridden_keys():
    shown = CliRunner().invoke(app, ["rehearse", "--help"], terminal_width=400).output
    assert all(key in " ".join(shown.split()) for key in rehearse.OVERRIDES)


def test_unknown_sizes_is_one_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["rehearse", "--out", str(tmp_path / "r"), "--sizes", "huge"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: unknown --sizes 'huge'; allowed: tiny, paper"
    assert not (tmp_path / "r").exists()


def test_an_out_that_is_a_file_or_cannot_be_written_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("kept")
    result = CliRunner().invoke(app, ["rehearse", "--out", str(tmp_path / "file"), "--no-repro"])
    assert result.exit_code == 2 and "is not an empty folder: give a new folder" in result.output
    assert (tmp_path / "file").read_text() == "kept"
    result = CliRunner().invoke(app, ["rehearse", "--out", str(tmp_path / "file" / "r"), "--no-repro"])
    assert result.exit_code == 2 and "could not clone the project into" in result.output, result.output


@pytest.mark.slow  # and so outside the fast tier, which `-m "not slow"` selects over pyproject's `not rehearsal`
@pytest.mark.rehearsal
def test_the_untouched_paper_profile_runs_end_to_end_offline(tmp_path):
    """`xdbert rehearse --sizes tiny`: the paper profile's whole graph, offline against the mirror, writes every
    report, with Table 1's seven rows named as the paper names them and the paper's row under each."""
    out = tmp_path / "r"
    done = subprocess.run(["xdbert", "rehearse", "--sizes", "tiny", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"reports in {out / 'reports'} (random weights on a few examples" in done.stdout
    for report in ("table1.md", "table2.md", "table3.md", "table6.md", "table8.md", "figure4.md", "figure4.png",
                   "attention.md", "probes.md"):
        assert str(out / "reports" / report) in done.stdout
    table1 = (out / "reports/table1.md").read_text()
    rows = [line.split(" | ")[0][2:] for line in table1.splitlines() if line.startswith("| ")]
    paper = ["CLIP-T", "BERT-b", "XDBERT-b", "ELECTRA-b", "XDELECTRA-b", "ELECTRA-l", "XDELECTRA-l"]
    ours = [r for r in rows if r in paper]
    assert ours == paper, rows
    assert all(f"*paper: {row}*" in rows for row in ours)
    table8 = (out / "reports/table8.md").read_text()
    assert all(f"| {row} | " in table8 for row in ("XBERT-b", "XELECTRA-b", "XELECTRA-l"))
    table6 = (out / "reports/table6.md").read_text()  # tiny configs under the paper's ids: counted, beside the paper's
    assert all(f"| {row} | " in table6 for row in ("BERT-b", "XBERT-b", "ELECTRA-b", "XELECTRA-b", "ELECTRA-l", "XELECTRA-l"))
    assert "| 442,671,617 |" in table6
    table2 = (out / "reports/table2.md").read_text()
    assert "BERT-b" in table2 and "ELECTRA-b" in table2
    assert "wiki (14G)" in (out / "reports/table3.md").read_text()
    assert list((out / "reports/attention").glob("*.png"))
    probes = (out / "reports/probes.md").read_text()  # every encoder a row of the linear probe, the reference's cloze
    rows = [f"{f}/{v}" for f in ("bert-b", "electra-b", "electra-l") for v in ("baseline", "xdbert")]
    assert all(f"| {row} |" in probes for row in [*rows, "bert-b/placeholder", "clip_t", "bert-base-cased"])
    status = subprocess.run(["dvc", "status"], cwd=out, capture_output=True, text=True, env=rehearse.offline_env(out))
    assert "up to date" in status.stdout, status.stdout  # every stage ran and is recorded in dvc.lock
