"""The caption-text control (`adapt.text: captions`, the variant `caption_mlm`): the captions packed into windows of
the shards' layout, the baseline's number of optimizer steps, the refusal of cross layers, MATCH and CLIPTC, a
tiny run that learns from the captions, and the `ablate@caption_mlm` stage end to end."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from adapt_repo import CLIP, TINY_BERT, build_repo
from xdbert.adaptation.captions import caption_windows, with_corpus
from xdbert.adaptation.loop import BatchMaker, adapt, total_steps
from xdbert.adaptation.settings import AdaptSettings
from xdbert.data import shards
from xdbert.data.captions import write_coco_captions
from xdbert.data.synthetic.words import generate_captions
from xdbert.data.tokenization.cleaning import clean_text
from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
from xdbert.errors import PipelineError
from xdbert.model.modeling import XDBertConfig, XDBertModel
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """data/corpus, data/shards, models/tokenizer (a 300-piece WordPiece, windows of 32), a random tiny
    models/pretrain_encoder/bert and data/captions/captions.json: what `ablate@caption_mlm` reads."""
    return build_repo(tmp_path_factory.mktemp("repo"), n_captions=120)


@pytest.fixture(scope="module")
def captions(repo):
    """(the captions, their windows, the BERT tokenizer, the shards' manifest)."""
    text = generate_captions(120, seed=0)
    tok = AutoTokenizer.from_pretrained(str(repo / "models" / "tokenizer"))
    manifest = shards.read_manifest(repo / "data" / "shards")
    windows = caption_windows(text, manifest, tok.backend_tokenizer.to_str(), clip_fast_tokenizer(CLIP).to_str())
    return text, windows, tok, manifest


def test_caption_windows_are_the_captions_packed_in_windows_of_the_shards_length(captions):
    text, windows, tok, manifest = captions
    rows = windows[np.arange(len(windows))]
    assert rows["bert_ids"].shape == (len(windows), manifest["max_len"]) and len(windows) > 5
    lengths = rows["bert_len"].astype(int)
    content = []
    for ids, n in zip(rows["bert_ids"], lengths):
        assert ids[0] == tok.cls_token_id and ids[n - 1] == tok.sep_token_id and (ids[n:] == tok.pad_token_id).all()
        content += ids[1:n - 1].tolist()
    # only the captions' text, all of it, in order: the tokens of the captions as one cleaned text
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    assert content == backend.encode(clean_text(" ".join(text)), add_special_tokens=False).ids
    # packed: a window ends where the next window's first word would not fit, so only the last is short
    capacity = manifest["max_len"] - 2
    starts = np.cumsum(lengths - 2) - (lengths - 2)
    word_start = ~np.array([backend.id_to_token(i).startswith("##") for i in content])
    for w in range(len(windows) - 1):
        nxt = starts[w + 1]
        next_word = 1 + int(np.argmax(word_start[nxt + 1:])) if word_start[nxt + 1:].any() else len(content) - nxt
        assert lengths[w] - 2 + next_word > capacity, (w, lengths[w])
    assert (lengths[:-1] >= capacity - 3).all()  # words of the captions are short: nearly full windows
    assert windows.manifest["content_sha256"] != caption_windows(
        text[1:], manifest, tok.backend_tokenizer.to_str(), clip_fast_tokenizer(CLIP).to_str()).manifest["content_sha256"]


def caption_settings(**kw) -> AdaptSettings:
    """The embedded profile's caption_mlm variant, with tiny batches, one epoch's steps and no warmup (and the
    attribute words no more often than any word: the tiny vocabulary cuts them into pieces)."""
    s = AdaptSettings.from_params(values("embedded"), "caption_mlm")
    assert (s.text, s.losses, s.cross_layers) == ("captions", ["mlm"], 0)
    return dataclasses.replace(s, **{"warmup_ratio": 0.0, "batch_size": 4, "micro_batch_size": 4, "eval_windows": 4,
                                     "checkpoint_every": 1000, "attribute_mlm_prob": 0.0, "epochs": 1, **kw})


def mlm_model(vocab_size: int) -> XDBertModel:
    torch.manual_seed(0)
    return XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=dict(TINY_BERT), vocab_size=vocab_size,
                                          clip=CLIP, clip_heads=2, clip_blocks=1, cross_layers=0, losses=["mlm"],
                                          clip_eot_id=49407))


class Seen:
    """A split that remembers which windows each read asked for."""

    def __init__(self, ds):
        self.ds, self.reads = ds, []

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        self.reads.append(np.asarray(i).tolist())
        return self.ds[i]


def test_a_caption_run_takes_the_corpus_runs_steps_cycling_through_its_windows(captions, tmp_path):
    _, windows, tok, manifest = captions
    s = caption_settings(lr=1e-4)
    corpus_windows = len(windows) * 2 + 3  # more corpus windows than caption windows: the captions cycle
    steps = total_steps(corpus_windows, s)
    assert steps == -(-corpus_windows // 4)
    for profile, epochs in (("embedded", 10), ("paper", 1)):  # the baseline's batches, `epochs` of its steps
        p = values(profile)
        assert total_steps(10_000, AdaptSettings.from_params(p, "caption_mlm")) == \
            epochs * total_steps(10_000, AdaptSettings.from_params(p, "baseline"))
    seen = Seen(windows)
    make = BatchMaker(s, manifest["n_blocks"], vocab_size=len(tok), special_ids=tok.all_special_ids,
                      mask_id=tok.mask_token_id, eot_id=49407)
    logged = []
    m = adapt(mlm_model(len(tok)), seen, windows, make, s, tmp_path / "c.pt", log=lambda x, step: logged.append(step),
              steps=steps)
    assert m["steps"] == steps and logged == list(range(steps))
    per_pass = -(-len(windows) // 4)
    passes = [sorted(sum(seen.reads[k:k + per_pass], [])) for k in range(0, 2 * per_pass, per_pass)]
    assert passes[0] == passes[1] == list(range(len(windows)))  # every window once a pass
    assert seen.reads[:per_pass] != seen.reads[per_pass:2 * per_pass]  # each pass in an order of its own


def test_a_tiny_adaptation_on_caption_windows_lowers_its_mlm_loss(captions, tmp_path):
    _, windows, tok, manifest = captions
    s = caption_settings(lr=3e-3, batch_size=8, micro_batch_size=8)
    make = BatchMaker(s, manifest["n_blocks"], vocab_size=len(tok), special_ids=tok.all_special_ids,
                      mask_id=tok.mask_token_id, eot_id=49407)
    m = adapt(mlm_model(len(tok)), windows, windows, make, s, tmp_path / "c.pt", steps=60)
    assert m["train_mlm_loss"] < m["first_mlm_loss"] - 0.7, (m["first_mlm_loss"], m["train_mlm_loss"])


@pytest.mark.slow  # kill and resume, seven trainings; the fast tier keeps adaptation's
def test_a_killed_caption_run_resumes_to_the_same_weights_and_other_captions_do_not(captions, tmp_path, capsys):
    """As every variant: a checkpoint resumes into the same steps (past a pass's end, into the next pass's
    order), and a checkpoint of other caption windows or another step count starts afresh."""
    text, windows, tok, manifest = captions
    s = caption_settings(lr=1e-3, checkpoint_every=2)
    make = BatchMaker(s, manifest["n_blocks"], vocab_size=len(tok), special_ids=tok.all_special_ids,
                      mask_id=tok.mask_token_id, eot_id=49407)
    steps = -(-len(windows) // 4) + 3  # into the second pass
    whole = mlm_model(len(tok))
    adapt(whole, windows, windows, make, s, tmp_path / "a.pt", steps=steps)
    other = caption_windows(text[1:], manifest, tok.backend_tokenizer.to_str(), clip_fast_tokenizer(CLIP).to_str())
    for name, (data, n) in {"length": (windows, steps + 2), "captions": (other, steps)}.items():
        adapt(mlm_model(len(tok)), data, windows, make, s, tmp_path / f"{name}.pt", steps=n, stop_after=2)
        capsys.readouterr()
        adapt(mlm_model(len(tok)), windows, windows, make, s, tmp_path / f"{name}.pt", steps=steps, stop_after=1)
        assert "starting afresh" in capsys.readouterr().out, name
    ckpt = tmp_path / "b.pt"
    adapt(mlm_model(len(tok)), windows, windows, make, s, ckpt, steps=steps, stop_after=steps - 1)  # killed
    resumed = mlm_model(len(tok))
    adapt(resumed, windows, windows, make, s, ckpt, steps=steps)
    assert f"resuming from {ckpt} at step {steps - 1 - (steps - 1) % 2}/{steps}" in capsys.readouterr().out
    a, b = whole.state_dict(), resumed.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.parametrize("override, got", [
    ({"cross_layers": 2}, "got cross_layers 2, losses ['mlm']"),
    ({"cross_layers": 2, "losses": ["mlm", "match"]}, "got cross_layers 2, losses ['mlm', 'match']"),
    ({"losses": ["mlm", "cliptc"]}, "got cross_layers 0, losses ['mlm', 'cliptc']"),
])
def test_captions_with_cross_layers_match_or_cliptc_are_refused(override, got):
    p = values("embedded")
    p["adapt"]["variants"]["caption_mlm"].update(override)
    with pytest.raises(PipelineError) as e:
        AdaptSettings.from_params(p, "caption_mlm")
    assert str(e.value) == (
        "`adapt.variants.caption_mlm.text: captions` trains the encoder alone with MLM on caption windows, which give "
        "no CLIP text to cross layers, MATCH or CLIPTC: it needs `adapt.variants.caption_mlm.cross_layers: 0` and "
        f"`adapt.variants.caption_mlm.losses: [mlm]`; {got}")
    p = values("embedded")
    p["adapt"]["text"] = "images"
    with pytest.raises(PipelineError, match="unknown adapt.text 'images'; allowed: corpus, captions"):
        AdaptSettings.from_params(p, "xdbert")


def run_stage(folder: Path, repo: Path, captions: list[str], monkeypatch, **variant) -> tuple[dict, dict]:
    """`python stages/adapt.py bert caption_mlm`, in this process, in `folder` with the tiny repo's shards and
    models and `captions` as data/captions/captions.json: (its metrics, the adapted encoder's weights)."""
    import runpy

    from safetensors.torch import load_file

    params = values("embedded")
    params["model"].update(encoder="random:bert", encoder_config=dict(TINY_BERT), clip=CLIP, clip_pretrained="")
    params["adapt"].update(batch_size=8, micro_batch_size=8, eval_windows=8, checkpoint_every=2)
    params["adapt"]["variants"]["caption_mlm"].update({"epochs": 1, "attribute_mlm_prob": 0.0, **variant})
    (folder / "data" / "captions").mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    (folder / "data" / "shards").symlink_to(repo / "data" / "shards", target_is_directory=True)
    write_coco_captions(captions, folder / "data" / "captions" / "captions.json")
    (folder / "models").mkdir()
    for name in ("tokenizer", "pretrain_encoder"):
        (folder / "models" / name).symlink_to(repo / "models" / name, target_is_directory=True)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["stages/adapt.py", "bert", "caption_mlm"])
    runpy.run_path(str(ROOT / "stages" / "adapt.py"), run_name="__main__")
    adapted = folder / "models" / "adapted" / "bert" / "caption_mlm"
    assert not (folder / "checkpoints" / "adapt" / "bert" / "caption_mlm.pt").exists()
    return (json.loads((folder / "metrics" / "adapt" / "bert" / "caption_mlm.json").read_text(encoding="utf-8")),
            load_file(adapted / "model.safetensors"))


def test_the_stage_adapts_on_the_captions_for_the_baselines_steps(repo, captions, tmp_path, monkeypatch, capsys):
    text, windows, _, manifest = captions
    metrics, weights = run_stage(tmp_path / "a", repo, text, monkeypatch)
    n_train = manifest["splits"]["train"]["windows"]
    # as many corpus windows beside the captions as `mechanism.caption_share` (0.5) asks
    assert (metrics["text"], metrics["train_windows"]) == ("captions", 2 * len(windows)) and len(windows) != n_train
    assert metrics["steps"] == -(-n_train // 8)  # the baseline's: one pass over the corpus windows
    assert (f"{len(windows):,} caption windows from data/captions/captions.json and {len(windows):,} corpus windows"
            in capsys.readouterr().out)
    # other captions, the same steps, other weights: the run learns from the captions, not the corpus
    other_metrics, other = run_stage(tmp_path / "b", repo, generate_captions(120, seed=1), monkeypatch)
    assert other_metrics["steps"] == metrics["steps"] and other.keys() == weights.keys()
    assert any(not torch.equal(other[k], weights[k]) for k in weights)


def test_the_caption_windows_go_beside_corpus_windows_at_the_share(captions, repo):
    """Every caption window, then corpus windows in order (wrapping round) up to `caption_share` of the whole:
    the control keeps reading the corpus (issue 68: on captions alone its corpus MLM accuracy fell to 0.22)."""
    _, windows, _, _ = captions
    corpus = shards.open_shards(repo / "data" / "shards", "train")
    for share, n_corpus in ((0.5, len(windows)), (0.25, 3 * len(windows)), (1.0, 0)):
        mixed = with_corpus(windows, corpus, share)
        assert len(mixed) == len(windows) + n_corpus
        rows, caption_rows = mixed[np.arange(len(mixed))], windows[np.arange(len(windows))]
        assert (rows["bert_ids"][:len(windows)] == caption_rows["bert_ids"]).all()
        order = np.arange(n_corpus) % len(corpus)
        assert (rows["bert_ids"][len(windows):] == corpus[order]["bert_ids"]).all()
    assert with_corpus(windows, corpus, 0.5).manifest["content_sha256"] != windows.manifest["content_sha256"]


def test_attribute_words_the_vocabulary_cuts_are_refused_by_name(repo, captions, tmp_path, monkeypatch, capsys):
    """`attribute_mlm_prob` masks whole attribute words: a vocabulary that cuts one into pieces is named, before any
    step is taken, with exit status 2."""
    with pytest.raises(SystemExit) as e:
        run_stage(tmp_path / "a", repo, captions[0], monkeypatch, attribute_mlm_prob=0.5)
    assert e.value.code == 2
    assert ("`adapt.variants.caption_mlm.attribute_mlm_prob`: the attribute word 'striped' is the tokens ['st', "
            in capsys.readouterr().err)
    assert not (tmp_path / "a" / "models" / "adapted").exists()
