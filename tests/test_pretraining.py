"""The embedded encoder's pretraining stand-in: restated pairs, their masking, a falling loss, resume."""
from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, BertConfig, BertForMaskedLM, BertTokenizer

from xdbert.adaptation import pretraining
from xdbert.adaptation.pretrain_settings import PretrainSettings
from xdbert.errors import PipelineError
from xdbert.model import IGNORE_INDEX
from xdbert.model.build import encoder_source
from xdbert.profiles import values

WORDS = ["the", "red", "blue", "cat", "dog", "boat", "saw", "built", "park", "hill", "in", "on", "a", "green", "man"]


def tokenizer(tmp_path) -> BertTokenizer:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "."]
    return BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True, model_max_length=64)


def corpus(n: int = 200) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) + "." for _ in range(n)]


def settings(**kw) -> PretrainSettings:
    """The embedded profile's settings, sized for these tiny models (60 steps, checkpoints every 10)."""
    base = dict(steps=60, batch_size=16, lr=5e-3, max_len=32, checkpoint_every=10)
    return dataclasses.replace(PretrainSettings.from_params(values("embedded")), **{**base, **kw})


def tiny_model(vocab_size: int) -> BertForMaskedLM:
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))


def test_sentences_and_restated_pairs():
    assert pretraining.split_sentences(["One two three four. Five six. Seven eight nine ten!"]) == \
        ["One two three four.", "Seven eight nine ten!"]
    first, second = pretraining.restated_pairs(corpus(), 64, random.Random(1))
    assert len(first) == len(second) == 64
    assert all(Counter(a.split()) == Counter(b.split()) for a, b in zip(first, second))  # the same words
    rotated = sum(a != b for a, b in zip(first, second))
    assert 16 < rotated < 48  # about half


def test_masking_targets_the_restatement_more(tmp_path):
    tok = tokenizer(tmp_path)
    first, second = pretraining.restated_pairs(corpus(), 64, random.Random(2))
    batch = pretraining.masked_batch(tok, first, second, settings(), torch.Generator().manual_seed(0))
    plain = tok(first, second, padding=True, return_tensors="pt")
    targets = batch["labels"] != IGNORE_INDEX
    assert torch.equal(batch["labels"][targets], plain["input_ids"][targets])
    real = plain["attention_mask"].bool() & ~torch.isin(plain["input_ids"], torch.tensor(tok.all_special_ids))
    in_a, in_b = real & (plain["token_type_ids"] == 0), real & (plain["token_type_ids"] == 1)
    assert 0.10 < (targets & in_a).sum() / in_a.sum() < 0.20
    assert 0.45 < (targets & in_b).sum() / in_b.sum() < 0.55
    assert not (targets & ~real).any()


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra", "distilbert"])
def test_target_logits_equal_the_full_heads_at_the_targets(tmp_path, model_type):
    # bert, roberta, electra decode only the targets (MLM_HEAD_MODULES); distilbert takes its own forward
    tok = tokenizer(tmp_path)
    first, second = pretraining.restated_pairs(corpus(), 16, random.Random(3))
    batch = pretraining.masked_batch(tok, first, second, settings(), torch.Generator().manual_seed(0))
    if model_type != "bert":
        batch.pop("token_type_ids")
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(AutoConfig.for_model(
        model_type, vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=70, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).eval()  # no dropout
    logits, labels = pretraining.target_logits(model, batch)
    targets = batch["labels"] != IGNORE_INDEX
    assert labels.tolist() == batch["labels"][targets].tolist() and logits.shape == (int(targets.sum()), len(tok))
    reference = model(**batch)
    assert torch.allclose(logits, reference.logits[targets], atol=1e-5)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    assert torch.allclose(loss, reference.loss, atol=1e-6)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    expected = torch.autograd.grad(reference.loss, list(model.parameters()), allow_unused=True)
    for g, e in zip(grads, expected):
        assert (g is None and e is None) or torch.allclose(g, e, atol=1e-6)


def test_pretraining_learns_to_fill_the_restatement(tmp_path):
    tok, sentences = tokenizer(tmp_path), corpus()
    metrics = pretraining.pretrain(tiny_model(len(tok)), tok, sentences, settings(steps=300), tmp_path / "a.pt")
    assert metrics["steps"] == 300
    # The words are drawn uniformly: guessing from frequencies stays near 1/16 and a loss of ln(16) = 2.77;
    # only copying from the first sentence goes below that.
    assert metrics["last_mlm_loss"] < 0.85 * metrics["first_mlm_loss"] and metrics["last_mlm_loss"] < 2.5, metrics
    assert metrics["last_mlm_accuracy"] > 0.25 > metrics["first_mlm_accuracy"], metrics


@pytest.mark.slow  # kill and resume, four trainings; the fast tier keeps adaptation's
def test_killed_pretraining_resumes_to_the_same_weights(tmp_path, capsys):
    tok, sentences = tokenizer(tmp_path), corpus()
    whole = tiny_model(len(tok))
    pretraining.pretrain(whole, tok, sentences, settings(), tmp_path / "a.pt")
    pretraining.pretrain(tiny_model(len(tok)), tok, sentences, settings(), tmp_path / "b.pt", stop_after=25)  # checkpoint at 20
    capsys.readouterr()
    resumed = tiny_model(len(tok))
    pretraining.pretrain(resumed, tok, sentences, settings(), tmp_path / "b.pt")
    assert "at step 20/60" in capsys.readouterr().out  # resumed, not started afresh
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    other = tiny_model(len(tok))  # a checkpoint of other settings is not resumed
    pretraining.pretrain(other, tok, sentences, settings(lr=1e-3), tmp_path / "b.pt")
    assert not torch.equal(other.state_dict()["cls.predictions.bias"], whole.state_dict()["cls.predictions.bias"])


def test_encoder_source_needs_the_stand_in_for_random_encoders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert encoder_source("bert-base-uncased") == "bert-base-uncased"
    with pytest.raises(PipelineError, match=r"run `dvc repro pretrain_encoder@bert`"):
        encoder_source("random:bert", family="bert")
    with pytest.raises(PipelineError, match="unknown encoder model type `notamodel`"):
        encoder_source("random:notamodel", family="bert")
    tiny_model(30).save_pretrained(tmp_path / "models" / "pretrain_encoder" / "bert")
    assert encoder_source("random:bert", family="bert") == "models/pretrain_encoder/bert"
    with pytest.raises(PipelineError, match=r"missing models/pretrain_encoder/electra: family 'electra'"):
        encoder_source("random:electra", family="electra")  # each family starts from its own stand-in


def test_clip_stand_in_settings_check_only_what_it_trains_with():
    p = values("embedded")
    s = PretrainSettings.clip_from_params(p, "")
    assert s.steps == p["pretrain"]["clip_steps"] and s.lr == p["pretrain"]["lr"]
    p["pretrain"]["mlm_prob"] = 7  # the encoder stand-in's masking: not the CLIP tower's business
    assert PretrainSettings.clip_from_params(p, "").steps == s.steps
    assert PretrainSettings.clip_from_params(p, "openai") is None  # pretrained weights: used as downloaded
    p["pretrain"]["clip_steps"] = 0
    assert PretrainSettings.clip_from_params(p, "") is None
    for steps in (-1, 1.5, True):
        p["pretrain"]["clip_steps"] = steps
        with pytest.raises(PipelineError, match=r"`pretrain.clip_steps` must be an integer >= 0"):
            PretrainSettings.clip_from_params(p, "openai")
    p = values("embedded")
    p["pretrain"]["weight_decay"] = 2
    with pytest.raises(PipelineError, match="`pretrain.weight_decay` must be a number between 0 and 1; got 2"):
        PretrainSettings.clip_from_params(p, "")
    del p["pretrain"]["seed"]
    with pytest.raises(PipelineError, match="missing param `pretrain.seed`"):
        PretrainSettings.from_params(p)


@pytest.mark.parametrize("family, key, value, message", [
    ("bert", "steps", 0, "`pretrain.steps` must be a positive integer; got 0"),
    ("bert", "lr", -1, "`pretrain.lr` must be a positive number; got -1"),
    ("bert", "restate_mask_prob", 1.5, "`pretrain.restate_mask_prob`"),
    ("roberta", "seed", 0, "unknown family 'roberta'; the study's families (`families`): bert"),
    ("bert", "max_len", 256, "`pretrain.max_len` = 256 is above the 128 positions of the encoder `random:bert`"),
    # a hub encoder is not pretrained here, but a misspelled or missing one must not replace the folder
    ("bert", "families.bert.encoder", "xdbert-tests/no-such-model",
     "could not load the config of the encoder `xdbert-tests/no-such-model`: it is not in this machine's hub cache"),
])
def test_stage_rejects_bad_params_and_keeps_the_previous_output(tmp_path, monkeypatch, capsys, family, key, value, message):
    import runpy
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    params = values("embedded")
    *section, name = key.split(".") if "." in key else ("pretrain", key)
    target = params
    for part in section:
        target = target[part]
    target[name] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    previous = tmp_path / "models" / "pretrain_encoder" / family
    previous.mkdir(parents=True)
    (previous / "config.json").write_text("previous output\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["stages/pretrain_encoder.py", family])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(root / "stages" / "pretrain_encoder.py"), run_name="__main__")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert (previous / "config.json").read_text(encoding="utf-8") == "previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "params.yaml"]  # no metrics, no checkpoint


# ---------------------------------------------------------------------------------------------------
# The CLIP tower's stand-in: next-token prediction on CLIP blocks
# ---------------------------------------------------------------------------------------------------

def clip_blocks(n: int = 200) -> torch.Tensor:
    """CLIP blocks of sentences that walk WORDS in order from a random start: each next word is certain."""
    from xdbert.clip import clip_tokenizer

    rng = random.Random(0)
    texts = []
    for _ in range(n):
        start = rng.randrange(len(WORDS))
        texts.append(" ".join(WORDS[(start + i) % len(WORDS)] for i in range(rng.randint(5, 9))))
    return clip_tokenizer("xdbert-tiny")(texts).long()  # (n, 77): [SOT] words [EOT], zero padded


def tiny_tower():
    from xdbert.model.clip_tower import CLIPTextTower

    torch.manual_seed(0)
    return CLIPTextTower.build("xdbert-tiny")


def test_clip_stand_in_learns_to_predict_the_next_token(tmp_path):
    metrics = pretraining.pretrain_clip(tiny_tower(), clip_blocks(), 49407, settings(steps=150), tmp_path / "c.pt")
    assert metrics["steps"] == 150
    # Guessing from frequencies gets about 1/16 of the words and the [EOT]s (1 target in 8): at most 0.2.
    # Only reading the previous token does better.
    assert metrics["last_lm_accuracy"] > 0.75 and metrics["last_lm_accuracy"] > metrics["first_lm_accuracy"] + 0.2, metrics
    assert metrics["last_lm_loss"] < 0.5 * metrics["first_lm_loss"], metrics


@pytest.mark.slow  # kill and resume, four trainings; the fast tier keeps adaptation's
def test_killed_clip_pretraining_resumes_to_the_same_weights(tmp_path, capsys):
    blocks = clip_blocks()
    whole = tiny_tower()
    pretraining.pretrain_clip(whole, blocks, 49407, settings(), tmp_path / "a.pt")
    pretraining.pretrain_clip(tiny_tower(), blocks, 49407, settings(), tmp_path / "b.pt", stop_after=25)
    capsys.readouterr()
    resumed = tiny_tower()
    pretraining.pretrain_clip(resumed, blocks, 49407, settings(), tmp_path / "b.pt")
    assert "at step 20/60" in capsys.readouterr().out
    for name, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_clip_stand_in_rejects_blocks_of_the_wrong_shape(tmp_path):
    with pytest.raises(PipelineError, match=r"blocks of shape \(N, 77\)"):
        pretraining.pretrain_clip(tiny_tower(), clip_blocks()[:, :40], 49407, settings(), tmp_path / "c.pt")
    assert not (tmp_path / "c.pt").exists()


def test_caption_mix_keeps_every_caption_and_fills_the_share_with_corpus_blocks_in_order():
    from xdbert.adaptation.pretraining import caption_mix

    captions, corpus = torch.full((6, 77), 7), torch.arange(4)[:, None].expand(4, 77)
    mixed = caption_mix(captions, corpus, 0.6)  # 6 captions are 60%: 4 corpus blocks
    assert mixed.shape == (10, 77) and (mixed[:6] == 7).all() and mixed[6:, 0].tolist() == [0, 1, 2, 3]
    assert caption_mix(captions, corpus, 0.5)[6:, 0].tolist() == [0, 1, 2, 3, 0, 1]  # wraps round the corpus
    assert len(caption_mix(captions, corpus, 1.0)) == 6
    with pytest.raises(ValueError, match="caption share in"):
        caption_mix(captions, corpus, 0.0)
