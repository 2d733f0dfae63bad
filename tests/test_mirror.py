"""The rehearsal's mirror in the real hub layouts (xdbert.hub_layouts), one asset at a time, each loaded the way its
stage loads it; and the loaders' constants held against the record of the real layouts.

Each layout test fails on the mirror's earlier files (weight/bias BERT keys, ELECTRA in safetensors, one fp16 CLIP
file, wikitext without headings, escapes or a second shard, cards without `dataset_info`, SWAG without a test
split) or when the library path it exercises is switched off (transformers' gamma/beta rename, `.bin` loading)."""
from __future__ import annotations

import functools
import zipfile
from pathlib import Path

import huggingface_hub.constants
import pandas as pd
import pytest
import torch
import transformers.modeling_utils
from datasets import ClassLabel, load_dataset
from datasets.info import DatasetInfosDict
from huggingface_hub import DatasetCard
from safetensors import safe_open

from test_fetch import cache, pin, snapshot  # noqa: F401  (cache: a fixture)
from xdbert import fetch, mirror
from xdbert.clip import clip_weights_repo, pinned_clip_weights
from xdbert.data import corpus
from xdbert.data.tasks.hub import GLUE, HUB_SPLITS, SWAG_CONFIG, load_glue, load_swag
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.hub import source
from xdbert.hub_layouts import DATASETS, MODELS
from xdbert.model.encoders import PRETRAINED_MLM_HEADS, build_language_encoder, load_pretrained_mlm_head
from xdbert.model.layers import MaskedTokenHead
from xdbert.profiles import values

REVISION = "d" * 40
PAPER = values("paper")


def mirrored(key: str) -> Path:
    """The mirror's asset named by param `key` of the paper profile, tiny, in the hub cache and pinned."""
    asset = next(a for a in fetch.hub_assets(PAPER) if a.key == key)
    folder = snapshot(Path(huggingface_hub.constants.HF_HUB_CACHE), asset.repo_id, asset.repo_type, REVISION)
    folder.mkdir(parents=True)
    mirror.write_asset(folder, asset, PAPER, "tiny")
    pin(Path("hub.lock.json"), asset.repo_id, asset.repo_type, REVISION)
    return folder


def files(folder: Path) -> list[str]:
    return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())


def described(features) -> tuple:
    """`datasets` Features in the layout record's terms: (name, dtype or ClassLabel names), in order."""
    return tuple((name, tuple(f.names) if isinstance(f, ClassLabel) else f.dtype) for name, f in features.items())


# ----------------------------------------------------------------------------------------------------
# The loaders' constants against the record
# ----------------------------------------------------------------------------------------------------

def test_the_loaders_constants_match_the_real_layouts():
    assert {a.repo_id for a in fetch.hub_assets(PAPER)} == set(MODELS) | set(DATASETS)
    glue = DATASETS[PAPER["tasks"]["glue_hub_id"]]
    for task, (config, col_a, col_b) in GLUE.items():
        real = glue["configs"][config]
        text = [name for name, kind in real["features"] if kind == "string"]
        assert [col_a, col_b] == (text + [None])[:2], task
        spec = get_task(task)
        assert dict(real["features"])["label"] == (spec.label_names or "float32"), task  # GLUE's label order
        assert dict(real["features"])["idx"] == "int32"
        assert [HUB_SPLITS[s] for s in spec.splits] == [s for s in real["splits"] if s not in glue["unlabeled"]], task
    swag = DATASETS[PAPER["tasks"]["swag_hub_id"]]
    assert list(swag["configs"]) == [SWAG_CONFIG]
    assert [HUB_SPLITS[s] for s in get_task("swag").splits] == [s for s in swag["configs"][SWAG_CONFIG]["splits"]
                                                                  if s not in swag["unlabeled"]]
    wiki = DATASETS[PAPER["corpus"]["hub_id"]]
    assert list(wiki["configs"]) == [PAPER["corpus"]["hub_config"]]
    assert set(corpus.HUB_SPLITS.values()) <= set(wiki["configs"][PAPER["corpus"]["hub_config"]]["splits"])
    assert wiki["configs"][PAPER["corpus"]["hub_config"]]["features"] == (("text", "string"),)
    assert corpus.is_title(wiki["title"]) and not corpus.is_title(wiki["heading"])
    clip = PAPER["model"]["clip"], PAPER["model"]["clip_pretrained"]
    assert MODELS[clip_weights_repo(*clip)]["clip"] == clip
    encoders = [PAPER["model"]["encoder"], PAPER["probes"]["reference"]] + [
        f["encoder"] for f in PAPER["families"].values() if "encoder" in f]
    assert set(encoders) == {repo for repo, m in MODELS.items() if "config" in m}
    assert PAPER["probes"]["coda_hub_id"] in DATASETS


# ----------------------------------------------------------------------------------------------------
# Encoders
# ----------------------------------------------------------------------------------------------------

def test_bert_keeps_the_tf_era_layer_norm_names_that_transformers_renames_on_load(cache, monkeypatch):  # noqa: F811
    """Fails on the old mirror (weight/bias keys), and when transformers' legacy gamma/beta rename is patched out."""
    folder = mirrored("model.encoder")
    assert files(folder) == sorted(MODELS["bert-base-uncased"]["files"])
    assert (folder / "pytorch_model.bin").read_bytes() == mirror.PLACEHOLDER  # safetensors is what transformers reads
    with safe_open(folder / "model.safetensors", "pt") as f:
        weights = {k: f.get_tensor(k) for k in f.keys()}
    assert {"bert.embeddings.LayerNorm.gamma", "bert.embeddings.LayerNorm.beta", "cls.predictions.transform.LayerNorm.gamma",
            "cls.predictions.bias"} <= set(weights)
    assert not [k for k in weights if k.endswith(("LayerNorm.weight", "LayerNorm.bias"))]
    encoder = build_language_encoder("bert-base-uncased")  # refuses missing weights
    assert torch.equal(encoder.embeddings.LayerNorm.weight, weights["bert.embeddings.LayerNorm.gamma"])
    head = MaskedTokenHead(encoder.config.hidden_size, encoder.get_input_embeddings())
    assert load_pretrained_mlm_head("bert-base-uncased", head)
    _, norm, _ = PRETRAINED_MLM_HEADS["bert"]
    assert torch.equal(head.layer_norm.bias, weights[f"{norm}.beta"])

    renames = transformers.modeling_utils.get_model_conversion_mapping
    monkeypatch.setattr(transformers.modeling_utils, "get_model_conversion_mapping",
                        functools.partial(renames, add_legacy=False))
    with pytest.raises(PipelineError, match=r"language encoder `bert-base-uncased` lacks \d+ of its weights "
                                            r"\(embeddings.LayerNorm.bias, embeddings.LayerNorm.weight"):
        build_language_encoder("bert-base-uncased")
    assert not load_pretrained_mlm_head("bert-base-uncased", head)


def test_bert_base_cased_has_its_config_vocabulary_size_and_casing_and_its_mlm_head(cache):  # noqa: F811
    """The probes' reference: uncased's release but 28,996 tokens and no lower-casing (the vocabulary a stand-in)."""
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer

    folder = mirrored("probes.reference")
    layout = MODELS["bert-base-cased"]
    assert files(folder) == sorted(layout["files"])
    assert len((folder / "vocab.txt").read_text(encoding="utf-8").splitlines()) == layout["config"]["vocab_size"] == 28996
    tok = load_encoder_tokenizer("bert-base-cased")
    assert len(tok) == 28996 and tok.tokenize("Red") != tok.tokenize("red")
    assert [tok.convert_tokens_to_ids(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    encoder = build_language_encoder("bert-base-cased")
    assert encoder.get_input_embeddings().num_embeddings == 28996
    assert load_pretrained_mlm_head("bert-base-cased", MaskedTokenHead(encoder.config.hidden_size, encoder.get_input_embeddings()))


@pytest.mark.parametrize("key, repo_id", [("families.electra-b.encoder", "google/electra-base-discriminator"),
                                          ("families.electra-l.encoder", "google/electra-large-discriminator")])
def test_electra_ships_a_legacy_pickle_only_which_transformers_loads_with_torch_load(cache, monkeypatch, key, repo_id):  # noqa: F811
    """Fails on the old mirror (model.safetensors), and when transformers refuses `.bin` files (as under torch < 2.6)."""
    folder = mirrored(key)
    assert files(folder) == sorted(MODELS[repo_id]["files"]) and not list(folder.glob("*.safetensors"))
    assert not zipfile.is_zipfile(folder / "pytorch_model.bin")  # torch's pre-1.6 pickle
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    encoder = build_language_encoder(repo_id)
    assert all(torch.equal(v, weights[f"electra.{k}"]) for k, v in encoder.state_dict().items())
    head = MaskedTokenHead(encoder.config.hidden_size, encoder.get_input_embeddings())
    assert not load_pretrained_mlm_head(repo_id, head)  # a discriminator has no MLM head: absent by design

    def refuse() -> None:
        raise ValueError("torch.load refused")

    monkeypatch.setattr(transformers.modeling_utils, "check_torch_load_is_safe", refuse)
    with pytest.raises(PipelineError, match=rf"cannot load the language encoder `{repo_id}` \(torch.load refused\)"):
        build_language_encoder(repo_id)


def test_clip_ships_float32_weights_beside_placeholders_and_loads_strictly(cache):  # noqa: F811
    """Fails on the old mirror (one fp16 file)."""
    from xdbert.model.clip_tower import CLIPTextTower

    repo = clip_weights_repo(PAPER["model"]["clip"], PAPER["model"]["clip_pretrained"])
    folder = mirrored("model.clip_pretrained")
    layout = MODELS[repo]
    assert files(folder) == sorted(layout["files"])
    assert all((folder / f).read_bytes() == mirror.PLACEHOLDER for f in layout["files"] if f != layout["weights"])
    with safe_open(folder / layout["weights"], "pt") as f:
        weights = {k: f.get_tensor(k) for k in f.keys()}
    assert {w.dtype for w in weights.values()} == {torch.float32}
    assert pinned_clip_weights(PAPER["model"]["clip"], PAPER["model"]["clip_pretrained"]) == str(folder / layout["weights"])
    tower = CLIPTextTower.build(PAPER["model"]["clip"], PAPER["model"]["clip_pretrained"])  # require_pretrained, strict
    assert torch.equal(tower.token_embedding.weight, weights["token_embedding.weight"])


# ----------------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------------

def check_card(folder: Path, layout: dict) -> None:
    """The card: glob paths, and `dataset_info` with the real features and the slice's own split sizes."""
    card = DatasetCard.load(folder / "README.md").data
    assert all(f["path"].endswith("-*") for c in card.configs for f in c["data_files"])
    infos = DatasetInfosDict.from_dataset_card_data(card)
    assert set(infos) == {c["config_name"] for c in card.configs}
    for config, info in infos.items():
        assert described(info.features) == layout["configs"][config]["features"]
        rows = {s: sum(len(pd.read_parquet(f)) for f in (folder / config).glob(f"{s}-*"))
                for s in layout["configs"][config]["splits"]}
        assert {s: info.splits[s].num_examples for s in info.splits} == rows


def test_wikitext_has_headings_escapes_and_two_train_shards_which_the_corpus_loader_reads(cache, tmp_path):  # noqa: F811
    """Fails on the old mirror (one train file, no headings or escapes, no `dataset_info`)."""
    hub_id, config = PAPER["corpus"]["hub_id"], PAPER["corpus"]["hub_config"]
    layout = DATASETS[hub_id]
    folder = mirrored("corpus.hub_id")
    assert [f for f in files(folder) if f.endswith(".parquet")] == sorted(
        f"{config}/{split}-{i:05d}-of-{n:05d}.parquet" for split, n in layout["configs"][config]["splits"].items()
        for i in range(n))
    check_card(folder, layout)
    shards = sorted((folder / config).glob("train-*"))
    lines = [line for shard in shards for line in pd.read_parquet(shard)["text"]]
    assert len(shards) == 2 and all(len(pd.read_parquet(s)) for s in shards)
    assert layout["heading"] in lines and all(e in lines for e in layout["escaped"])
    docs = corpus.load_hub_corpus(hub_id, config, cache_dir=str(tmp_path / "datasets"))
    assert docs["train"] == list(corpus.documents_from_lines(lines))  # both shards, in order
    assert len(docs["train"]) == mirror.DOCS["train"] and len(docs["valid"]) == mirror.DOCS["valid"]
    text = "\n".join(docs["train"])
    assert "@" not in text and "= =" not in text and "one-dollar" in text and "0.7 – 2.2 kg" in text


def test_glue_and_swag_have_the_real_configs_features_and_test_splits(cache, tmp_path):  # noqa: F811
    """Fails on the old mirror (no `dataset_info`, exact paths, SWAG without its test split)."""
    glue_id, swag_id = PAPER["tasks"]["glue_hub_id"], PAPER["tasks"]["swag_hub_id"]
    for key, repo in (("tasks.glue_hub_id", glue_id), ("tasks.swag_hub_id", swag_id)):
        layout = DATASETS[repo]
        folder = mirrored(key)
        check_card(folder, layout)
        for config in (c for c in layout["configs"] if (folder / c).is_dir()):
            ds = load_dataset(source(repo, "dataset"), config, cache_dir=str(tmp_path / "datasets"))
            assert list(ds) == list(layout["configs"][config]["splits"])
            assert all(set(ds[s]["label"]) == {-1} for s in ds if s in layout["unlabeled"])
            assert all(-1 not in ds[s]["label"] for s in ds if s not in layout["unlabeled"])
    tasks = [t for t in PAPER["tasks"]["names"] if t in GLUE]
    assert tasks
    for task in tasks:
        splits = load_glue(task, glue_id, cache_dir=str(tmp_path / "datasets"))
        assert {s: t.num_rows for s, t in splits.items()} == {s: mirror.ROWS["train" if s == "train" else "dev"]
                                                             for s in get_task(task).splits}
    swag = load_swag(swag_id, cache_dir=str(tmp_path / "datasets"))
    assert {s: t.num_rows for s, t in swag.items()} == {"train": mirror.ROWS["train"], "dev": mirror.ROWS["dev"]}
