"""The adaptation loop and the `adapt` stage: losses fall, a killed run resumes exactly, NaN stops
cleanly, bad params fail before any work, and the saved encoder is a plain transformers checkpoint.

Everything runs on shards the dual_tokenize stage's own code (`xdbert.data.tokenization.build`) writes from a few
generated documents: max_len 32, one CLIP block, a 300-piece WordPiece vocabulary.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModel, AutoTokenizer

from adapt_repo import CLIP, TINY_BERT, build_repo
from xdbert import training
from xdbert.adaptation.loop import BatchMaker, adapt, evaluate, weighted_loss
from xdbert.adaptation.settings import AdaptSettings
from xdbert.clip import clip_block_mask
from xdbert.data import shards
from xdbert.data.tokenization.vocab import train_wordpiece
from xdbert.errors import PipelineError
from xdbert.model.clip_tower import CLIPTextTower
from xdbert.model.modeling import XDBertConfig, XDBertModel, count_parameters
from xdbert.model.saving import load_full, save_adapted, save_clip_tower
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
SOT, EOT = 49406, 49407  # CLIP BPE's <|startoftext|> and <|endoftext|>
LOSSES = ["mlm", "match", "cliptc"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A folder as the corpus, dual_tokenize, pretrain_encoder@bert and pretrain_clip stages leave it: data/corpus,
    data/shards, models/tokenizer, models/pretrain_encoder/bert, models/pretrain_clip and its twin
    models/pretrain_clip_nofacts (a random tiny BERT and random CLIP towers: these tests do not need them
    trained; the `nofacts` variant adapts beside the twin), and data/captions/captions.json."""
    root = build_repo(tmp_path_factory.mktemp("repo"), n_captions=60)
    save_clip_tower(CLIPTextTower.build(CLIP), root / "models" / "pretrain_clip", CLIP)
    # the twin as a copy: which facts it holds is no matter to these tests (tests/test_mechanism_stage.py)
    shutil.copytree(root / "models" / "pretrain_clip", root / "models" / "pretrain_clip_nofacts")
    return root


@pytest.fixture(scope="module")
def data(repo):
    train = shards.open_shards(repo / "data" / "shards", "train")
    valid = shards.open_shards(repo / "data" / "shards", "valid")
    assert len(train) >= 24 and len(valid) >= 4 and train.max_len == 32 and train.n_blocks == 1
    return train, valid, AutoTokenizer.from_pretrained(str(repo / "models" / "tokenizer"))


class Subset:
    """Some windows of a split, indexed like a ShardDataset (what `adapt` needs: len and array indexing)."""

    def __init__(self, ds, index):
        self.ds, self.index = ds, np.asarray(index)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        return self.ds[self.index[i]]


def settings(**kw) -> AdaptSettings:
    """The embedded profile's `xdbert` variant sized for these tiny runs, with the paper's unweighted loss sum."""
    base = dict(losses=list(LOSSES), warmup_ratio=0.0, batch_size=4, micro_batch_size=2, checkpoint_every=2,
                eval_windows=4, loss_weights=None)
    return dataclasses.replace(AdaptSettings.from_params(values("embedded"), "xdbert"), **{**base, **kw})


def make_batch(data, s: AdaptSettings) -> BatchMaker:
    tok = data[2]
    return BatchMaker(s, 1, vocab_size=len(tok), special_ids=tok.all_special_ids, mask_id=tok.mask_token_id, eot_id=EOT)


def config(data) -> XDBertConfig:
    return XDBertConfig(encoder="random:bert", encoder_config=dict(TINY_BERT), vocab_size=len(data[2]), clip=CLIP,
                        clip_heads=2, clip_blocks=1, cross_layers=1, losses=list(LOSSES), clip_eot_id=EOT)


def build_model(data, seed: int = 0) -> XDBertModel:
    torch.manual_seed(seed)  # as the stage does: the initial weights are a function of model.seed
    return XDBertModel.build(config(data))


def run(data, s: AdaptSettings, checkpoint: Path, train=None, seed: int = 0, **kw):
    """(model, metrics) of `adapt` on a freshly built model, as the stage calls it."""
    model = build_model(data, seed)
    train = train if train is not None else Subset(data[0], np.arange(12))
    return model, adapt(model, train, data[1], make_batch(data, s), s, checkpoint, **kw)


# ---------------------------------------------------------------------------------------------------
# 1. Training lowers every loss; the schedule steps once per optimizer step
# ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """40 steps on a fixed set of two windows, 16 per step (each window 8 times)."""
    s = settings(epochs=40, batch_size=16, micro_batch_size=16, warmup_ratio=0.05, eval_windows=8,
                 checkpoint_every=1000)
    logged = []
    model, metrics = run(data, s, tmp_path_factory.mktemp("ckpt") / "trained.pt", train=Subset(data[0], np.tile([0, 1], 8)),
                         log=lambda m, step: logged.append((step, m)))
    return model, metrics, logged


def test_training_lowers_each_loss(trained):
    _, m, logged = trained
    assert m["steps"] == 40 and [step for step, _ in logged] == list(range(40))
    for name in LOSSES:
        assert m[f"train_{name}_loss"] < m[f"first_{name}_loss"], (name, m[f"first_{name}_loss"], m[f"train_{name}_loss"])
    # Clear margins for the token objectives (match only has to beat chance: two windows, same-text pairs)
    assert m["train_mlm_loss"] < m["first_mlm_loss"] - 0.5
    assert m["train_cliptc_loss"] < m["first_cliptc_loss"] - 1.5
    first, last = [np.mean([lg["match_loss"] for _, lg in logged[a:b]]) for a, b in ((0, 5), (-8, None))]
    assert last < first - 0.03, (first, last)
    assert m["train_mlm_accuracy"] > m["first_mlm_accuracy"]
    for name in LOSSES:  # valid metrics come from the fixed-seed evaluation on the valid split
        assert np.isfinite(m[f"valid_{name}_loss"]) and 0 <= m[f"valid_{name}_accuracy"] <= 1


@pytest.mark.slow
def test_fp16_on_the_cpu_autocasts_scales_the_loss_and_learns(data, tmp_path, monkeypatch):
    """fp16 as a V100 or T4 runs it (no such GPU here, so on the CPU): the forward in half precision, the
    loss scaled by torch's GradScaler, the scale kept in the checkpoint, and training still learns."""
    scales = []
    update = torch.amp.GradScaler.update

    def recording_update(self, *args):
        scales.append(self.get_scale())
        update(self, *args)

    monkeypatch.setattr(torch.amp.GradScaler, "update", recording_update)
    s = settings(epochs=20, batch_size=16, micro_batch_size=16, warmup_ratio=0.05, eval_windows=8,
                 checkpoint_every=10, precision="fp16")
    model = build_model(data)
    dtypes = set()
    model.cross_layers[0].language_ffn.dense_in.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    checkpoint = tmp_path / "fp16.pt"
    metrics = adapt(model, Subset(data[0], np.tile([0, 1], 8)), data[1], make_batch(data, s), s, checkpoint, stop_after=10)
    assert dtypes == {torch.float16}  # training steps and the evaluation ran in fp16
    assert len(scales) == 10 and scales[0] == 2.0 ** 16  # GradScaler's initial scale, then updated each step
    saved = torch.load(checkpoint, weights_only=False)["scaler"]
    assert saved["scale"] > 0 and saved["_growth_tracker"] >= 0
    assert metrics["precision"] == "fp16" and metrics["steps"] == 10
    assert metrics["train_mlm_loss"] < metrics["first_mlm_loss"] - 0.25  # fp32: 0.30-0.33 lower after 10 steps (seeds 0-2)


@pytest.mark.slow  # two bf16 adaptations, every op seen by a dispatch mode
def test_a_step_casts_each_weight_once_whatever_its_micro_batches(data, tmp_path):
    """Under bf16 autocast the step's micro-batches share one cast copy of each trained weight: 4
    micro-batches cast the weights as often as 1 does (a region per micro-batch cast them all again for each)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def weight_casts(micro_batch_size: int) -> int:
        model = build_model(data)
        # autocast caches the casts of trained weights only (a frozen one is cast at each use)
        weights = {p.data_ptr() for p in model.parameters() if p.requires_grad}
        casts = []

        class CountCasts(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16
                        and args[0].data_ptr() in weights):
                    casts.append(args[0].data_ptr())
                return func(*args, **kwargs)

        # the final evaluation's 4 windows are one micro-batch either way
        s = settings(batch_size=16, micro_batch_size=micro_batch_size, eval_windows=4, precision="bf16")
        with CountCasts():
            adapt(model, Subset(data[0], np.arange(32)), data[1], make_batch(data, s), s,
                  tmp_path / f"{micro_batch_size}.pt", stop_after=1)
        assert len(set(casts)) > 10
        return len(casts)

    assert weight_casts(4) == weight_casts(16)


def test_auto_precision_follows_the_gpu(monkeypatch):
    from xdbert import training

    assert training.mixed_precision("auto", "cpu") == "no"
    for capability, expected in (((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert training.mixed_precision("auto", "cuda:0") == expected  # V100, T4, A100, H100
    assert training.mixed_precision("fp16", "cpu") == "fp16" and training.mixed_precision("no", "cuda:0") == "no"
    with pytest.raises(ValueError, match="unknown precision 'fp8'; allowed: auto, bf16, fp16, no"):
        training.mixed_precision("fp8", "cpu")


def test_loss_weights_scale_each_objective_in_the_trained_loss(data):
    model = build_model(data).eval()  # no dropout: two forward passes give the same losses
    batch = make_batch(data, settings())(data[0][np.arange(8)], torch.Generator().manual_seed(0))
    out = model(**batch)
    assert torch.equal(weighted_loss(out, None), out["loss"])  # no weights: the paper's unweighted sum
    expected = out["mlm_loss"] + 5 * out["match_loss"] + 0.5 * out["cliptc_loss"]
    assert torch.allclose(weighted_loss(out, {"match": 5.0, "cliptc": 0.5}), expected)

    def match_head_grad(weights):
        model.zero_grad()
        weighted_loss(model(**batch), weights).backward()
        return model.match_head.classifier.weight.grad.clone()  # only MATCH reaches the MATCH head

    assert torch.allclose(match_head_grad({"match": 5.0}), 5 * match_head_grad(None), rtol=1e-4, atol=1e-7)


def test_a_distill_variant_adapts_on_the_shards_alignment(data, tmp_path):
    """Issue 55's control end to end: the shards' alignment gives targets on real CLIP content tokens, and the
    loop logs its loss, held out too, with no accuracy."""
    s = settings(losses=[*LOSSES, "distill"], loss_weights={"distill": 1.0}, epochs=1)
    batch = make_batch(data, s)(data[0][np.arange(8)], torch.Generator().manual_seed(0))
    labels = batch["distill_labels"]
    assert (labels >= 0).sum() > 20
    clip = batch["clip_ids"].reshape(len(labels), -1)
    real = clip_block_mask(batch["clip_ids"], EOT).reshape(len(labels), -1)
    targets = torch.gather(clip, 1, labels.clamp(min=0))[labels >= 0]
    assert torch.gather(real, 1, labels.clamp(min=0))[labels >= 0].all() and not torch.isin(targets, torch.tensor([SOT, EOT])).any()
    torch.manual_seed(0)
    model = XDBertModel.build(dataclasses.replace(config(data), losses=s.losses))
    metrics = adapt(model, Subset(data[0], np.arange(8)), data[1], make_batch(data, s), s, tmp_path / "distill.pt")
    assert 0 < metrics["train_distill_loss"] < 2 and 0 < metrics["valid_distill_loss"] < 2
    assert "valid_distill_accuracy" not in metrics and "valid_cliptc_accuracy" in metrics


def test_learning_rate_follows_warmup_then_linear_decay(trained):
    """One schedule step per optimizer step (accelerate would take one per process if it owned it)."""
    _, _, logged = trained
    peak, total, warmup = 1e-3, 40, 2  # warmup_ratio 0.05 of 40 steps
    for step, lg in logged:
        done = step + 1
        expected = peak * done / warmup if done < warmup else peak * (total - done) / (total - warmup)
        assert lg["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15), (step, lg["lr"], expected)


class Recording(Subset):
    """A Subset that notes which of its windows each read asked for."""

    def __init__(self, ds, index):
        super().__init__(ds, index)
        self.reads: list[list[int]] = []

    def __getitem__(self, i):
        self.reads.append(np.asarray(i).tolist())
        return super().__getitem__(i)


def test_evaluation_reads_a_fixed_random_sample_of_valid_windows(data):
    """Consecutive windows share a document; evaluating them in order would draw MATCH negatives from the
    window's own article. The sample is random, the same on every call, and so are the metrics."""
    s = settings(eval_windows=8, micro_batch_size=4)
    model = build_model(data)
    runs = []
    for _ in range(2):
        valid = Recording(data[0], np.arange(24))
        runs.append((evaluate(model, valid, make_batch(data, s), s, "cpu"), valid.reads))
    (first, reads), (second, reads_again) = runs
    assert reads == reads_again and first == second
    assert 0.5 <= first["match_majority"] <= 1 and first["match_majority"] * 8 == round(first["match_majority"] * 8)
    seen = [i for r in reads for i in r]
    assert [len(r) for r in reads] == [4, 4] and len(set(seen)) == 8
    assert seen != list(range(8)) and max(seen) >= 8  # not the first eight windows
    assert all(r == sorted(r) for r in reads)  # each read in file order (Arrow reads are cheaper)


def test_evaluation_computes_in_the_training_precision(data):
    """Validation runs under the loop's autocast (bf16 forced here on the CPU): on a GPU it would otherwise
    compute every matrix product in fp32, and report a model other than the one trained."""
    s = settings(eval_windows=8, micro_batch_size=4)
    model = build_model(data)
    seen = []
    model.register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    valid = Subset(data[0], np.arange(24))
    plain = evaluate(model, valid, make_batch(data, s), s, "cpu")
    assert seen == [False, False]
    bf16 = evaluate(model, valid, make_batch(data, s), s, "cpu", training.Precision("bf16", "cpu").autocast)
    assert seen[2:] == [True, True]
    assert bf16.keys() == plain.keys() and bf16 != plain  # the same metrics, computed in bf16
    assert bf16["mlm_loss"] == pytest.approx(plain["mlm_loss"], rel=0.05)


# ---------------------------------------------------------------------------------------------------
# 2. A killed run resumes and ends exactly where an uninterrupted one does
# ---------------------------------------------------------------------------------------------------

def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_after_a_kill_gives_identical_weights(data, tmp_path, capsys):
    # 12 windows, 4 per step in micro-batches of 2, 2 epochs: 6 steps; dropout on (the tiny BERT's 0.1)
    s = settings(epochs=2)
    log_a, log_b = [], []
    model_a, metrics_a = run(data, s, tmp_path / "a.pt", log=lambda m, step: log_a.append((step, m)))
    assert metrics_a["steps"] == 6 and metrics_a["device"] == "cpu"

    ckpt = tmp_path / "b.pt"
    run(data, settings(epochs=2, lr=2e-3), ckpt, stop_after=2)  # a checkpoint made with other settings
    capsys.readouterr()
    _, stopped = run(data, s, ckpt, stop_after=5)  # killed after step 5: its last checkpoint is step 4
    assert "other settings or inputs; starting afresh" in capsys.readouterr().out
    assert stopped["steps"] == 5 and torch.load(ckpt, weights_only=False)["step"] == 4

    model_b, metrics_b = run(data, s, ckpt, log=lambda m, step: log_b.append((step, m)))  # a new process
    assert f"resuming from {ckpt} at step 4/6" in capsys.readouterr().out
    assert log_b == log_a and [step for step, _ in log_b] == list(range(6))  # the plots replay steps 0-3
    a, b = state(model_a), state(model_b)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different
    assert {k: v for k, v in metrics_a.items() if k != "seconds"} == {k: v for k, v in metrics_b.items() if k != "seconds"}
    fresh = state(build_model(data))
    assert not torch.equal(fresh["encoder.embeddings.word_embeddings.weight"], b["encoder.embeddings.word_embeddings.weight"])


@pytest.mark.slow
def test_compiled_adaptation_ends_with_the_eager_weights(data, tmp_path, monkeypatch):
    """`adapt.compile` runs the training steps through torch.compile and saves the plain module. Dynamo's
    `eager` backend runs the captured graphs: the tracing and graph breaks are real, only the code
    generation (measured on an H100 in bench/results/h100) is left out. With `fullgraph=True` any graph
    break fails: the stage's batches carry where their CLIP tokens and targets are, so the forward reads
    nothing of its data on the host and traces whole, whatever the micro-batch's shapes."""
    from torch._dynamo.utils import counters

    real_compile, calls = torch.compile, []

    def compile_eagerly(model, **kw):
        calls.append(kw)
        return real_compile(model, backend="eager", fullgraph=True, **kw)

    model_a, metrics_a = run(data, settings(epochs=2), tmp_path / "eager.pt")
    monkeypatch.setattr(torch, "compile", compile_eagerly)
    torch._dynamo.reset()
    counters.clear()
    model_b, metrics_b = run(data, settings(epochs=2, compile=True), tmp_path / "compiled.pt")
    assert calls == [{}] and counters["stats"]["unique_graphs"] >= 1  # dynamo really captured the model
    a, b = state(model_a), state(model_b)
    assert a.keys() == b.keys() == torch.load(tmp_path / "compiled.pt", weights_only=False)["model"].keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert metrics_b["train_mlm_loss"] == pytest.approx(metrics_a["train_mlm_loss"], rel=1e-5)

def test_checkpoint_of_other_initial_weights_is_not_resumed(data, tmp_path, capsys):
    """Same settings, another `model.seed`: resuming would continue from the other run's weights."""
    ckpt = tmp_path / "c.pt"
    run(data, settings(), ckpt, seed=1, stop_after=2)
    capsys.readouterr()
    _, metrics = run(data, settings(), ckpt, seed=0, stop_after=2)
    assert "other settings or inputs; starting afresh" in capsys.readouterr().out
    assert metrics["steps"] == 2  # resumed, it would have gone on from step 2 to 3


# ---------------------------------------------------------------------------------------------------
# 3. A NaN loss stops the run with a PipelineError and keeps the last checkpoint
# ---------------------------------------------------------------------------------------------------

def test_nan_loss_stops_and_keeps_the_last_checkpoint(data, tmp_path):
    s = settings(epochs=2, micro_batch_size=4)  # 6 steps, one forward pass each
    ckpt = tmp_path / "n.pt"
    run(data, s, ckpt, stop_after=2)
    saved = ckpt.read_bytes()

    model = build_model(data)
    forward, calls = model.forward, []

    def nan_on_second_call(**kw):
        out = forward(**kw)
        calls.append(1)
        if len(calls) == 2:  # resumed at step 2: the second pass is step 3
            out["loss"] = out["loss"] * float("nan")
        return out

    model.forward = nan_on_second_call
    with pytest.raises(PipelineError, match=r"adapt: the loss became nan at step 3.*last checkpoint is kept"):
        adapt(model, Subset(data[0], np.arange(12)), data[1], make_batch(data, s), s, ckpt)
    assert ckpt.read_bytes() == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.pt"]  # no temporary file left behind
    assert torch.load(ckpt, weights_only=False)["step"] == 2


# ---------------------------------------------------------------------------------------------------
# 5. The saved encoder is a plain transformers checkpoint of the original size
# ---------------------------------------------------------------------------------------------------

def test_saved_adapted_encoder_loads_with_automodel(trained, data, repo, tmp_path):
    model = trained[0].cpu().eval()  # `adapt` leaves it on the GPU when there is one; the inputs here are CPU tensors
    out = save_adapted(model, tmp_path / "adapted" / "xdbert", tokenizer_dir=repo / "models" / "tokenizer")
    loaded = AutoModel.from_pretrained(str(out)).eval()
    fresh = build_model(data)
    assert type(loaded) is type(fresh.encoder)
    assert sum(p.numel() for p in loaded.parameters()) == count_parameters(fresh, "encoder") \
        == count_parameters(model, "encoder")
    assert AutoTokenizer.from_pretrained(str(out)).get_vocab() == data[2].get_vocab()
    rows = data[0][np.arange(4)]
    ids = torch.from_numpy(rows["bert_ids"].astype(np.int64))
    mask = torch.from_numpy(rows["bert_mask"].astype(np.int64))
    with torch.no_grad():
        got = loaded(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.equal(got, model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state)
        assert not torch.allclose(got, fresh.encoder.eval()(input_ids=ids, attention_mask=mask).last_hidden_state)


# ---------------------------------------------------------------------------------------------------
# 4. The stage: bad input exits 2 with one line and touches nothing; a good run writes every output
# ---------------------------------------------------------------------------------------------------

def test_variant_settings_apply_overrides_and_name_the_key_a_value_came_from():
    p = values("embedded")
    assert AdaptSettings.from_params(p, "two_epochs").epochs == 2
    baseline = AdaptSettings.from_params(p, "baseline")
    assert baseline.losses == ["mlm"] and baseline.cross_layers == 0 and baseline.lr == p["adapt"]["lr"]
    p["adapt"]["baseline"]["cross_layers"] = -1
    with pytest.raises(PipelineError, match=r"`adapt.baseline.cross_layers` must be an integer >= 0 \(0: the MLM-only baseline\); got -1"):
        AdaptSettings.from_params(p, "baseline")
    p["adapt"]["baseline"].update(cross_layers=0, losses=["mlm", "match"])
    with pytest.raises(PipelineError, match=r"`adapt.baseline.cross_layers: 0` \(the MLM-only baseline, or it with an "
                                            r"encoder-side control\) allows only `adapt.baseline.losses: \[mlm\]` with distill "
                                            r"or kl besides, without placeholder; got losses \['mlm', 'match'\]"):
        AdaptSettings.from_params(p, "baseline")
    p["adapt"]["baseline"]["losses"] = ["mlm"]
    for key, value, allowed in (("mlm_prob", 0, "above 0"), ("match_prob", 1.0, "above 0 and below 1")):
        q = values("embedded")
        q["adapt"][key] = value  # a loss that learns nothing is refused, naming its key
        with pytest.raises(PipelineError, match=rf"`adapt.{key}` must be {allowed} while `adapt.losses` has {key[:-5]}"):
            AdaptSettings.from_params(q, "xdbert")
    q["adapt"]["match_prob"] = 0  # without MATCH among its losses, a variant ignores it
    assert AdaptSettings.from_params(q, "mlm").losses == ["mlm"]
    q = values("embedded")
    q["adapt"]["micro_batch_size"] = 1  # a forward pass of one window has no other window to be MATCH's negative
    with pytest.raises(PipelineError, match=r"`adapt.micro_batch_size` must be at least 2 while `adapt.losses` has match"):
        AdaptSettings.from_params(q, "xdbert")
    assert AdaptSettings.from_params(q, "mlm").micro_batch_size == 1
    p["adapt"]["variants"]["mlm"] = {"nope": 1}
    with pytest.raises(PipelineError, match=r"adapt.variants.mlm overrides unknown keys \['nope'\]"):
        AdaptSettings.from_params(p, "mlm")
    p["adapt"]["precision"] = "fp8"
    with pytest.raises(PipelineError, match="unknown adapt.precision 'fp8'; allowed: auto, bf16, fp16, no"):
        AdaptSettings.from_params(p, "xdbert")


def set_key(params: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        params = params[key]
    params[last] = value


TINY_MODEL = {"model.encoder": "random:bert", "model.encoder_config": dict(TINY_BERT), "model.clip": CLIP,
              "model.clip_pretrained": ""}

TWO_FAMILIES = {"families.electra": {"label": "ELECTRA-tiny", "encoder": "random:electra", "size": "base", "layer_lr_decay": 0.8}}

# name: (variant or family/variant (family bert by default), changes to params.yaml, a different tokenizer in
# models/tokenizer, words the error names)
ERRORS = {
    "unknown_variant": ("nope", {}, False, ["unknown adaptation variant 'nope'", "allowed: xdbert, baseline, mlm_match"]),
    "unknown_family": ("roberta/xdbert", {}, False, ["unknown family 'roberta'", "(`families`): bert"]),
    "ablation_of_another_family": ("electra/mlm", TWO_FAMILIES, False,
                                   ["ablation variant 'mlm' is adapted on `adapt.family` (bert) only", "xdbert and baseline"]),
    "bad_family_decay": ("xdbert", {"families.bert.layer_lr_decay": 0}, False, ["`families.bert.layer_lr_decay` must be in (0, 1]"]),
    "empty_losses": ("xdbert", {"adapt.losses": []}, False, ["`adapt.losses` is empty", "mlm, match, cliptc, distill, kl"]),
    "unknown_loss": ("xdbert", {"adapt.losses": ["mlm", "itm"]}, False, ["`adapt.losses`", "'itm'", "allowed: mlm, match, cliptc, distill, kl"]),
    "zero_epochs": ("xdbert", {"adapt.epochs": 0}, False, ["`adapt.epochs` must be a positive integer; got 0"]),
    "variant_epochs": ("two_epochs", {"adapt.variants.two_epochs": {"epochs": 0}}, False,
                       ["`adapt.variants.two_epochs.epochs` must be a positive integer; got 0"]),
    "negative_lr": ("xdbert", {"adapt.lr": -1}, False, ["`adapt.lr` must be a positive number; got -1"]),
    "unknown_loss_weight": ("xdbert", {"adapt.loss_weights": {"mlm": 1.0, "itm": 2.0}}, False,
                            ["`adapt.loss_weights` names itm, which is not a loss; allowed: mlm, match, cliptc, distill, kl"]),
    "zero_loss_weight": ("mlm_match", {"adapt.variants.mlm_match": {"loss_weights": {"match": 0}}}, False,
                         ["`adapt.variants.mlm_match.loss_weights.match` must be a positive number; got 0"]),
    "negative_init_range": ("xdbert", {"adapt.init_range": -0.02}, False, ["`adapt.init_range` must be a positive number; got -0.02"]),
    "unknown_cliptc_vocab": ("xdbert", {"adapt.cliptc_vocab": "corpus"}, False, ["unknown adapt.cliptc_vocab 'corpus'", "allowed: full, shards"]),
    "flag_not_bool": ("xdbert", {"adapt.mlm_negatives": "no"}, False, ["`adapt.mlm_negatives` must be true or false; got 'no'"]),
    "compile_not_a_setting": ("two_epochs", {"adapt.variants.two_epochs": {"epochs": 2, "compile": "gpu"}}, False,
                              ["`adapt.variants.two_epochs.compile` must be true, false or auto (on a GPU only); got 'gpu'"]),
    "unknown_encoder_type": ("xdbert", {**TINY_MODEL, "model.encoder": "random:notamodel"}, False,
                             ["the encoder `random:notamodel`", "random:<a transformers model type>", "random:bert"]),
    "unknown_clip": ("xdbert", {**TINY_MODEL, "model.clip": "notaclip"}, False, ["`model.clip: notaclip`", "xdbert-tiny"]),
    "clip_heads_not_dividing": ("mlm_match", {**TINY_MODEL, "adapt.variants.mlm_match": {"losses": ["mlm", "match"], "clip_heads": 3}},
                                False, ["`adapt.variants.mlm_match.clip_heads` = 3 does not divide the width 64 of CLIP's text "
                                        "tower `xdbert-tiny`; allowed: 1, 2, 4, 8, 16, 32, 64"]),
    "other_tokenizer": ("xdbert", TINY_MODEL, True, ["another vocabulary", "models/tokenizer", "dvc repro dual_tokenize"]),
    "captions_with_cross_layers": ("caption_mlm", {"adapt.variants.caption_mlm": {"losses": ["mlm"], "text": "captions"}},
                                   False, ["`adapt.variants.caption_mlm.text: captions` trains the encoder alone",
                                           "it needs `adapt.cross_layers: 0`", "got cross_layers 2"]),
}


def stage_args(variant: str) -> list[str]:
    """`python stages/adapt.py FAMILY VARIANT`'s arguments: `variant` or `family/variant`, family bert by default."""
    return variant.split("/") if "/" in variant else ["bert", variant]


def stage_folder(cwd: Path, repo: Path, variant: str, changes: dict, tokenizer: Path | None = None) -> Path:
    """A repository-shaped folder: the embedded profile's params with `changes`, the shards and tokenizer of
    `repo` (or another `tokenizer`), and a previous models/adapted/<family>/<variant> that must survive errors."""
    params = values("embedded")
    for key, value in changes.items():
        set_key(params, key, value)
    (cwd / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    (cwd / "data").symlink_to(repo / "data", target_is_directory=True)
    (cwd / "models").mkdir()
    (cwd / "models" / "tokenizer").symlink_to(tokenizer or repo / "models" / "tokenizer", target_is_directory=True)
    for stand_in in ("pretrain_encoder", "pretrain_clip", "pretrain_clip_nofacts"):
        (cwd / "models" / stand_in).symlink_to(repo / "models" / stand_in, target_is_directory=True)
    previous = cwd / "models" / "adapted" / "/".join(stage_args(variant))
    previous.mkdir(parents=True)
    (previous / "config.json").write_text("previous output\n", encoding="utf-8")
    return cwd


@pytest.fixture(autouse=True, scope="module")
def started_stage_runs(repo, tmp_path_factory):
    """Every bad-input case as `python stages/adapt.py FAMILY VARIANT` in its own folder, started before the
    first test so that the three that pay the heavy imports do so while the training tests run:
    name -> (folder, variant, running process)."""
    other_tokenizer = tmp_path_factory.mktemp("other") / "tokenizer"
    train_wordpiece(["completely different words for another vocabulary"] * 5, 80, 64).save_pretrained(str(other_tokenizer))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    started = {}
    for name, (variant, changes, other, _) in ERRORS.items():
        cwd = stage_folder(tmp_path_factory.mktemp(name), repo, variant, changes, other_tokenizer if other else None)
        proc = subprocess.Popen([sys.executable, str(ROOT / "stages" / "adapt.py"), *stage_args(variant)], cwd=cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started[name] = (cwd, variant, proc)
    yield started
    for _, _, proc in started.values():  # a test that failed early: do not leave processes behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def stage_runs(started_stage_runs):
    """name -> (folder, variant, completed process) once every started run has finished."""
    runs = {}
    for name, (cwd, variant, proc) in started_stage_runs.items():
        out, err = proc.communicate(timeout=240)
        runs[name] = (cwd, variant, subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return runs


@pytest.mark.parametrize("name", list(ERRORS))
def test_stage_rejects_bad_input_and_touches_nothing(stage_runs, name):
    cwd, variant, result = stage_runs[name]
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for words in ERRORS[name][3]:
        assert words in lines[0], (words, lines[0])
    assert "Traceback" not in result.stderr and result.stdout == ""
    previous = cwd / "models" / "adapted" / "/".join(stage_args(variant))
    assert sorted(p.name for p in previous.iterdir()) == ["config.json"]
    assert (previous / "config.json").read_text(encoding="utf-8") == "previous output\n"
    assert sorted(p.name for p in cwd.iterdir()) == ["data", "models", "params.yaml"]  # no checkpoints, metrics, dvclive
    assert sorted(p.name for p in (cwd / "models").iterdir()) == ["adapted", "pretrain_clip", "pretrain_clip_nofacts",
                                                                   "pretrain_encoder", "tokenizer"]


def test_stage_writes_encoder_full_model_and_metrics(repo, tmp_path, monkeypatch, capsys):
    """A good run, in this process (its imports are already paid) exactly as `python stages/adapt.py bert xdbert`."""
    import runpy

    changes = {**TINY_MODEL, "model.seed": 0, "adapt.epochs": 1, "adapt.batch_size": 16, "adapt.micro_batch_size": 8,
               "adapt.eval_windows": 8, "adapt.checkpoint_every": 1}
    cwd = stage_folder(tmp_path, repo, "xdbert", changes)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["stages/adapt.py", "bert", "xdbert"])
    runpy.run_path(str(ROOT / "stages" / "adapt.py"), run_name="__main__")  # a PipelineError would exit 2
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("adapt@bert: valid_mlm_loss=")
    adapted = cwd / "models" / "adapted" / "bert" / "xdbert"
    assert (adapted / "config.json").read_text(encoding="utf-8") != "previous output\n"  # replaced
    encoder = AutoModel.from_pretrained(str(adapted))
    assert encoder.config.hidden_size == 32 and encoder.config.vocab_size == len(AutoTokenizer.from_pretrained(str(adapted)))
    full = load_full(cwd / "models" / "crossmodal" / "bert" / "xdbert")
    assert full.config.losses == LOSSES and full.config.clip_blocks == 1 and full.config.clip_heads == 2
    assert all(torch.equal(v, full.encoder.state_dict()[k]) for k, v in encoder.state_dict().items())
    metrics = json.loads((cwd / "metrics" / "adapt" / "bert" / "xdbert.json").read_text(encoding="utf-8"))
    n_train = shards.read_manifest(repo / "data" / "shards")["splits"]["train"]["windows"]
    assert (metrics["family"], metrics["variant"], metrics["steps"]) == ("bert", "xdbert", -(-n_train // 16))
    assert metrics["mlm_head"] == "pretrained:models/pretrain_encoder/bert"  # the stand-in's own MLM head, copied
    assert all(np.isfinite(metrics[f"valid_{k}_loss"]) for k in LOSSES)
    assert not (cwd / "checkpoints" / "adapt" / "bert" / "xdbert.pt").exists()  # done: the checkpoint is removed
    # dvclive's plots: each series one row per step, 0 to the last, and the summary its last values at that step
    live = cwd / "dvclive" / "adapt" / "bert" / "xdbert"
    summary = json.loads((live / "metrics.json").read_text(encoding="utf-8"))
    assert summary["step"] == metrics["steps"] - 1 and {"lr", "mlm_loss", "match_loss", "cliptc_loss"} < summary.keys()
    for name in summary.keys() - {"step"}:
        rows = [row.split("\t") for row in (live / "plots" / "metrics" / f"{name}.tsv").read_text().splitlines()]
        assert rows[0] == ["step", name] and [int(r[0]) for r in rows[1:]] == list(range(metrics["steps"])), name
        assert float(rows[-1][1]) == summary[name], name


# ---------------------------------------------------------------------------------------------------
# Several processes (one per GPU on a GPU machine): the same training as one process
# ---------------------------------------------------------------------------------------------------

def one_per_recipe(variants: dict) -> list[str]:
    """The variants less those that differ from an earlier one (or from xdbert) only in what they read or how
    long: the twins (`nofacts`, beside the twin tower or its captions) and `two_epochs` run their partners' code.
    Each adaptation costs this test seconds in three processes."""
    seen, kept = [{}], []
    for name, changes in variants.items():
        recipe = {k: v for k, v in changes.items() if k not in ("clip_tower", "text", "epochs")}
        if recipe not in seen:
            seen.append(recipe)
            kept.append(name)
    return kept


VARIANTS = ["xdbert", *one_per_recipe(values("embedded")["adapt"]["variants"]), "baseline"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapt_in_processes(repo: Path, root: Path, world: int) -> list[subprocess.CompletedProcess]:
    """Each of VARIANTS through the stage's own code, in `world` processes together (gloo), each rank in its
    own copy of the folder so what each one writes can be told apart."""
    changes = {**TINY_MODEL, "model.seed": 0, "adapt.epochs": 1, "adapt.batch_size": 8, "adapt.micro_batch_size": 2,
               "adapt.eval_windows": 4, "adapt.checkpoint_every": 2, "adapt.warmup_ratio": 0.0,
               # the caption reference at one epoch, its attribute words as any word (the tiny vocabulary cuts them)
               "adapt.variants.caption_mlm.epochs": 1, "adapt.variants.caption_mlm.attribute_mlm_prob": 0.0}
    for rank in range(world):
        for variant in VARIANTS:
            folder = root / f"rank{rank}" / variant
            folder.mkdir(parents=True)
            stage_folder(folder, repo, variant, changes)
            shutil.rmtree(folder / "models" / "adapted")  # no previous output: whatever appears was written here
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    if world > 1:  # what `accelerate launch` sets in each process it starts
        env.update(WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "adapt_processes.py"), str(root), *VARIANTS],
                              env={**env, **({"RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else {})},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    streams = [p.communicate(timeout=600) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, streams)]


def outputs(folder: Path, variant: str) -> tuple[dict, dict]:
    """(every tensor the stage saved, by file and name; the metrics without wall-clock and process count)."""
    from safetensors.torch import load_file

    tensors = {f"{path.relative_to(folder)}:{name}": t for path in sorted((folder / "models").rglob("*.safetensors"))
               for name, t in load_file(path).items()}
    metrics = json.loads((folder / "metrics" / "adapt" / "bert" / f"{variant}.json").read_text())
    return tensors, {k: v for k, v in metrics.items() if k not in ("seconds", "processes")}


def noise_steps(name: str, t: torch.Tensor) -> torch.Tensor:
    """Which entries of tensor `name` can have a true gradient of 0 or near it, whose float noise Adam turns
    into steps of up to lr that differ with the order of sums: biases of attention keys (HF's `key.bias`,
    the middle third of open_clip's `in_proj_bias`: attention ignores a shift shared by every key), and
    CLIP's token embeddings (a rare token's gradient sums a few positions that can cancel; without CLIPTC
    the tower learns only through cross-attention, and one row of 49,408 differed by 1.6e-5)."""
    mask = torch.zeros_like(t, dtype=torch.bool)
    if name.endswith(("key.bias", "clip.token_embedding.weight")):
        mask[:] = True
    elif name.endswith("in_proj_bias"):
        width = t.shape[0] // 3
        mask[width:2 * width] = True
    return mask


@pytest.mark.slow
def test_two_processes_train_each_recipe_as_one_does(repo, tmp_path):
    """The same global batch over 2 processes (gloo) and over 1, with dropout on: the same weights and
    metrics within float tolerance. Micro-batch j of a step is masked and dropped out from its own seeds,
    so the two ranks draw different randomness, each what one process draws for that micro-batch. A
    variant with a parameter no loss reaches (the last CLIP stream without CLIPTC) would stop DDP."""
    one = adapt_in_processes(repo, tmp_path / "one", 1)
    two = adapt_in_processes(repo, tmp_path / "two", 2)
    for result in one + two:
        assert result.returncode == 0, result.stderr[-3000:]
    for variant in VARIANTS:
        single, main, other = (tmp_path / "one" / "rank0" / variant, tmp_path / "two" / "rank0" / variant,
                               tmp_path / "two" / "rank1" / variant)
        config = json.loads((single / "models" / "adapted" / "bert" / variant / "config.json").read_text())
        assert config["hidden_dropout_prob"] > 0 and config["attention_probs_dropout_prob"] > 0
        (w1, m1), (w2, m2) = outputs(single, variant), outputs(main, variant)
        assert w1.keys() == w2.keys() and len(w1) > 10
        for name, t in w1.items():
            loose = noise_steps(name, t)
            torch.testing.assert_close(w2[name][~loose], t[~loose], rtol=1e-4, atol=5e-6, msg=f"{variant} {name}")
            torch.testing.assert_close(w2[name][loose], t[loose], rtol=0, atol=1e-4, msg=f"{variant} {name}")
        assert m1.keys() == m2.keys() and m1["steps"] == m2["steps"] > 1
        for key, value in m1.items():
            assert m2[key] == (pytest.approx(value, rel=1e-4, abs=1e-5) if isinstance(value, float) else value), (variant, key)
        assert json.loads((main / "metrics" / "adapt" / "bert" / f"{variant}.json").read_text())["processes"] == 2
        # the main process alone writes outputs and removes the checkpoint; the other wrote nothing
        assert (main / "dvclive" / "adapt" / "bert" / variant).is_dir()
        assert not (main / "checkpoints" / "adapt" / "bert" / f"{variant}.pt").exists()
        assert sorted(p.name for p in other.iterdir()) == ["data", "models", "params.yaml"]
        assert sorted(p.name for p in (other / "models").iterdir()) == ["pretrain_clip", "pretrain_clip_nofacts",
                                                                        "pretrain_encoder", "tokenizer"]


def test_launch_command_starts_one_process_per_gpu_once():
    from xdbert.adaptation.launch import launch_command

    argv = ["stages/adapt.py", "bert", "xdbert"]
    command = launch_command(argv, 4, env={})
    assert command[1:3] == ["-m", "accelerate.commands.launch"] and command[-3:] == argv
    assert command[command.index("--num_processes") + 1] == "4" and "--multi_gpu" in command
    assert launch_command(argv, 1, env={}) is None and launch_command(argv, 0, env={}) is None
    assert launch_command(argv, 4, env={"LOCAL_RANK": "0", "WORLD_SIZE": "4"}) is None  # a launched process trains
