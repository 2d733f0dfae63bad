"""The cross-modal model: Table 6 parameter counts, shapes, masks, attention, losses, saving."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, BertForMaskedLM

from xdbert.clip import clip_block_mask
from xdbert.adaptation.masking import adaptation_inputs
from xdbert.errors import PipelineError
from xdbert.model import clip_tower
from xdbert.model.clip_tower import CLIPTextTower, clip_uses_quick_gelu
from xdbert.model.encoders import build_language_encoder
from xdbert.model.layers import CrossModalLayer, MaskedTokenHead
from xdbert.model.modeling import XDBertConfig, XDBertModel, count_parameters, locate
from xdbert.model.saving import load_full, save_adapted, save_full

SOT, EOT = 49406, 49407
CLS, SEP, MASK = 2, 3, 4
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_config(**changes) -> XDBertConfig:
    base = XDBertConfig(encoder="random:bert", encoder_config=dict(TINY_BERT), vocab_size=100, clip="xdbert-tiny",
                        clip_heads=4, clip_blocks=3)
    return dataclasses.replace(base, **changes)


def tiny_model(seed: int = 0, **changes) -> XDBertModel:
    torch.manual_seed(seed)
    return XDBertModel.build(tiny_config(**changes))


def fake_batch(batch: int = 4, length: int = 16, n_blocks: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Windows of different lengths; window 0 uses 2 blocks, the others 1; block 2 is never used; the
    CLIP content contains id 0 ("!") so a `== 0` mask would be wrong."""
    g = torch.Generator().manual_seed(seed)
    bert_ids = torch.randint(5, 100, (batch, length), generator=g)
    bert_mask = torch.ones(batch, length, dtype=torch.long)
    clip_ids = torch.zeros(batch, n_blocks, 77, dtype=torch.long)
    for i in range(batch):
        n = length - 2 * i
        bert_ids[i, 0], bert_ids[i, n - 1] = CLS, SEP
        bert_ids[i, n:], bert_mask[i, n:] = 0, 0
        m = 10 + 3 * i
        clip_ids[i, 0, 0], clip_ids[i, 0, m + 1] = SOT, EOT
        clip_ids[i, 0, 1:m + 1] = torch.randint(0, 1000, (m,), generator=g)
        clip_ids[i, 0, 2] = 0
    clip_ids[0, 1, 0], clip_ids[0, 1, 1:6], clip_ids[0, 1, 6] = SOT, torch.tensor([0, 5, 6, 0, 7]), EOT
    return {"bert_ids": bert_ids, "bert_mask": bert_mask, "clip_ids": clip_ids}


def fixed_labels(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Deterministic targets: MLM at positions 1..3 (inputs masked), MATCH 1,0,1,0, CLIPTC at content 1..4."""
    bert_ids = b["bert_ids"].clone()
    mlm = torch.full_like(bert_ids, -100)
    mlm[:, 1:4] = bert_ids[:, 1:4]
    bert_ids[:, 1:4] = MASK
    cliptc = torch.full_like(b["clip_ids"], -100)
    cliptc[:, 0, 1:5] = b["clip_ids"][:, 0, 1:5]
    match = torch.tensor([1, 0, 1, 0][: len(bert_ids)])
    return {"bert_ids": bert_ids, "bert_mask": b["bert_mask"], "clip_ids": b["clip_ids"], "mlm_labels": mlm,
            "match_labels": match, "cliptc_labels": cliptc}


# ---------------------------------------------------------------- Table 6 (built on the meta device)

ELECTRA_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, embedding_size=1024)


@pytest.mark.parametrize("encoder, overrides, encoder_count, full_count", [
    ("random:bert", {}, 109_482_240, 202_059_009),
    ("random:electra", ELECTRA_LARGE, 334_092_288, 442_671_617),
])
def test_table6_parameter_counts(encoder, overrides, encoder_count, full_count):
    with torch.device("meta"):
        model = XDBertModel.build(XDBertConfig(encoder=encoder, encoder_config=overrides, clip="ViT-B-32", clip_heads=8,
                                               cross_layers=2))
    assert count_parameters(model, "encoder") == encoder_count
    assert count_parameters(model, "clip") == 63_428_097
    assert count_parameters(model, "backbone") == full_count
    assert count_parameters(model, "all") == full_count + count_parameters(model, "heads")
    assert count_parameters(model, "heads") > 0
    # What is saved for finetuning is the language encoder alone, with the original count.
    assert sum(p.numel() for p in model.encoder.parameters()) == encoder_count


def test_one_cross_layer_at_bert_base_width():
    with torch.device("meta"):
        layer = CrossModalLayer(768, 512, language_heads=12, clip_heads=8, intermediate=3072)
    assert sum(p.numel() for p in layer.parameters()) == 14_574_336


def test_count_parameters_rejects_unknown_part():
    with pytest.raises(ValueError, match="allowed: encoder"):
        count_parameters(tiny_model(), "pooler")


# ---------------------------------------------------------------- CLIP input and tower

def test_clip_mask_comes_from_the_end_token_not_from_id_zero():
    b = fake_batch()
    mask = clip_block_mask(b["clip_ids"], EOT)
    assert mask.shape == b["clip_ids"].shape and mask.dtype == torch.bool
    assert mask[0, 0, :12].all() and not mask[0, 0, 12:].any()  # [SOT] + 10 tokens + [EOT], a 0 inside
    assert mask[0, 1].sum() == 7 and mask[0, 1, 1] and b["clip_ids"][0, 1, 1] == 0
    assert not mask[:, 2].any()  # the unused block
    assert not mask[1:, 1].any()


def test_tower_gives_open_clip_token_features_and_zeros_elsewhere():
    model = tiny_model().eval()
    tower = model.clip
    b = fake_batch()
    mask = clip_block_mask(b["clip_ids"], EOT)
    with torch.no_grad():
        out = tower(b["clip_ids"], mask)
        # Reference: open_clip's own text path (before pooling) on each full 77-token block.
        ids = b["clip_ids"].reshape(-1, 77)
        ref = tower.ln_final(tower.transformer(tower.token_embedding(ids) + tower.positional_embedding, attn_mask=tower.attn_mask))
    assert out.shape == (4, 3 * 77, 64)
    assert torch.isfinite(out).all()
    flat_mask = mask.reshape(-1, 77)
    got = out.reshape(-1, 77, 64)
    torch.testing.assert_close(got[flat_mask], ref[flat_mask], atol=1e-5, rtol=1e-5)
    assert (got[~flat_mask] == 0).all()
    # text_projection and logit_scale are kept (Table 6) but no loss reaches them.
    assert not tower.text_projection.requires_grad and not tower.logit_scale.requires_grad


def test_all_blocks_unused_gives_zeros_not_nans():
    model = tiny_model().eval()
    b = fake_batch()
    b["clip_ids"][:] = 0
    with torch.no_grad():
        language, clip = model.encode(**b)
    assert torch.isfinite(language).all() and torch.isfinite(clip).all()


def test_clip_quick_gelu_follows_the_pretrained_tag():
    assert clip_uses_quick_gelu("ViT-B-32", "openai") is True
    assert clip_uses_quick_gelu("ViT-B-32", "") is False


def test_unknown_clip_tag_and_offline_download_give_clear_errors(monkeypatch):
    with pytest.raises(PipelineError, match="clip_pretrained: nosuchtag.*openai"):
        CLIPTextTower.build("ViT-B-32", "nosuchtag")

    def offline(*args, **kwargs):
        raise RuntimeError("Failed to download weights") from ConnectionError("couldn't connect to huggingface.co")

    monkeypatch.setattr(clip_tower.open_clip, "create_model", offline)
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE"):
        CLIPTextTower.build("ViT-B-32", "openai")


# ---------------------------------------------------------------- language encoder

def test_language_encoder_errors():
    with pytest.raises(PipelineError, match="unknown encoder model type `nosuch`"):
        build_language_encoder("random:nosuch")
    with pytest.raises(PipelineError, match="cannot load the language encoder"):
        build_language_encoder("/nonexistent/encoder/folder")
    # Tests run with HF_HUB_OFFLINE=1 (conftest): a hub id is an offline failure with what to do.
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE=1"):
        build_language_encoder("xdbert-tests/not-downloaded")


def test_any_transformers_encoder_family_works():
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    b = fixed_labels(fake_batch())
    for model_type, extra in [("electra", {"embedding_size": 16}), ("roberta", {"pad_token_id": 1})]:
        torch.manual_seed(0)
        model = XDBertModel.build(tiny_config(encoder=f"random:{model_type}", encoder_config={**small, **extra}))
        out = model(**b)
        assert torch.isfinite(out["loss"]) and out["mlm_count"] == 12


def test_pretrained_mlm_head_and_encoder_load_from_a_local_checkpoint(tmp_path):
    # A folder in the hub's format: the same loader reads bert-base-uncased from the hub.
    torch.manual_seed(1)
    cfg = AutoConfig.for_model("bert", vocab_size=100, **TINY_BERT)
    reference = BertForMaskedLM(cfg)
    reference.save_pretrained(tmp_path / "bert")
    model = XDBertModel.build(tiny_config(encoder=str(tmp_path / "bert"), encoder_config={}, vocab_size=None))
    assert model.mlm_head_source.startswith("pretrained:")
    ref_head = reference.cls.predictions
    torch.testing.assert_close(model.mlm_head.dense.weight, ref_head.transform.dense.weight)
    torch.testing.assert_close(model.mlm_head.layer_norm.bias, ref_head.transform.LayerNorm.bias)
    torch.testing.assert_close(model.mlm_head.bias, ref_head.bias)
    torch.testing.assert_close(model.encoder.embeddings.word_embeddings.weight, reference.bert.embeddings.word_embeddings.weight)
    assert model.mlm_head.decoder.weight is model.encoder.get_input_embeddings().weight


def test_building_from_checkpoints_prints_no_library_reports(tmp_path, capfd, caplog):
    """An MLM checkpoint has no pooler (transformers' load report lists it) and the tiny CLIP tower is
    asked for without weights (open_clip warns it is random): both are expected and checked here, so
    neither reaches the stage's log. Logging is as before afterwards."""
    import logging

    from transformers.utils import logging as hf_logging

    BertForMaskedLM(AutoConfig.for_model("bert", vocab_size=100, **TINY_BERT)).save_pretrained(tmp_path / "bert")
    capfd.readouterr()
    verbosity, disabled = hf_logging.get_verbosity(), logging.root.manager.disable
    XDBertModel.build(tiny_config(encoder=str(tmp_path / "bert"), encoder_config={}, vocab_size=None))
    out, err = capfd.readouterr()
    assert "pooler" not in out + err + caplog.text and "initialized randomly" not in out + err + caplog.text
    assert (hf_logging.get_verbosity(), logging.root.manager.disable) == (verbosity, disabled)
    logging.warning("still heard")
    assert "still heard" in caplog.text


# ---------------------------------------------------------------- forward

def test_forward_shapes_losses_and_counts():
    model = tiny_model()
    b = fixed_labels(fake_batch())
    out = model(**b)
    for name in ("mlm", "match", "cliptc"):
        assert torch.isfinite(out[f"{name}_loss"]) and out[f"{name}_loss"] > 0
        assert 0 <= out[f"{name}_correct"] <= out[f"{name}_count"]
    assert out["mlm_count"] == 12 and out["match_count"] == 4 and out["cliptc_count"] == 16
    torch.testing.assert_close(out["loss"], out["mlm_loss"] + out["match_loss"] + out["cliptc_loss"])
    language, clip = model.encode(b["bert_ids"], b["bert_mask"], b["clip_ids"])
    assert language.shape == (4, 16, 32) and clip.shape == (4, 3 * 77, 64)
    assert torch.isfinite(language).all() and torch.isfinite(clip).all()
    out["loss"].backward()
    assert model.cross_layers[0].clip_cross.attention.key.weight.grad is not None


def test_vocabulary_logits_only_at_target_positions():
    model = tiny_model()
    b = fixed_labels(fake_batch())
    rows = {}
    model.mlm_head.decoder.register_forward_hook(lambda m, i, o: rows.__setitem__("mlm", (i[0].shape[0], o.shape)))
    model.cliptc_head.decoder.register_forward_hook(lambda m, i, o: rows.__setitem__("cliptc", (i[0].shape[0], o.shape)))
    model(**b)
    assert rows["mlm"] == (12, (12, 100))
    assert rows["cliptc"] == (16, (16, 49408))


def test_cliptc_restricted_to_classes_scores_only_them():
    model = tiny_model()
    b = fixed_labels(fake_batch())
    full = model(**b)
    # Restricted to every id, CLIPTC is the full-vocabulary loss itself.
    model.restrict_cliptc(torch.arange(49408))
    torch.testing.assert_close(model(**b)["cliptc_loss"], full["cliptc_loss"])
    # Restricted to the ids that occur, the softmax runs over those alone: the loss is the cross-entropy
    # of the full logits with every other id left out, and the MLM and MATCH losses do not change.
    targets = b["cliptc_labels"][b["cliptc_labels"] != -100]
    used = torch.unique(torch.cat([b["clip_ids"].reshape(-1), targets]))
    model.restrict_cliptc(used[torch.randperm(len(used))])  # any order: the classes are sorted
    rows = {}
    model.cliptc_head.dense.register_forward_hook(lambda m, i, o: rows.__setitem__("hidden", i[0]))
    out = model(**b)
    logits = model.cliptc_head(rows["hidden"])[:, torch.sort(used).values]
    expected = torch.nn.functional.cross_entropy(logits, torch.searchsorted(torch.sort(used).values, targets))
    torch.testing.assert_close(out["cliptc_loss"], expected)
    assert out["cliptc_loss"] < full["cliptc_loss"]  # fewer wrong classes to spread probability over
    assert out["cliptc_count"] == full["cliptc_count"] == 16
    for name in ("mlm_loss", "match_loss"):
        torch.testing.assert_close(out[name], full[name])
    out["loss"].backward()
    grad = model.clip.token_embedding.weight.grad
    unused = torch.ones(49408, dtype=torch.bool)
    unused[used] = False
    assert grad[unused].abs().sum() == 0 and grad[used].abs().sum() > 0
    with pytest.raises(ValueError, match="no CLIPTC head"):
        tiny_model(losses=["mlm", "match"]).restrict_cliptc(used)


def test_losses_follow_config_and_labels():
    model = tiny_model(losses=["mlm", "match"])
    assert model.cliptc_head is None
    out = model(**fixed_labels(fake_batch()))
    assert "cliptc_loss" not in out
    torch.testing.assert_close(out["loss"], out["mlm_loss"] + out["match_loss"])
    b = fake_batch()
    assert "loss" not in model(**b)  # no labels: no loss


def test_cross_attention_probabilities():
    model = tiny_model().eval()
    b = fake_batch()
    with torch.no_grad():
        out = model(**b, output_attentions=True)
        language_sdpa, clip_sdpa = model.encode(**b)
    clip_mask = clip_block_mask(b["clip_ids"], EOT).reshape(4, -1)
    bert_mask = b["bert_mask"].bool()
    assert len(out["cross_attentions"]) == 2
    for layer in out["cross_attentions"]:
        lang, clip = layer["language"], layer["clip"]
        assert lang.shape == (4, 2, 16, 231) and clip.shape == (4, 4, 231, 16)
        torch.testing.assert_close(lang.sum(-1), torch.ones(lang.shape[:-1]))
        torch.testing.assert_close(clip.sum(-1), torch.ones(clip.shape[:-1]))
        assert (lang.masked_select(~clip_mask[:, None, None, :].expand_as(lang)) == 0).all()
        assert (clip.masked_select(~bert_mask[:, None, None, :].expand_as(clip)) == 0).all()
    # The explicit path (full CLIP layout) and the SDPA path (all-padding positions dropped) compute the
    # same thing at every position that holds a token.
    with torch.no_grad():
        language_explicit, clip_explicit, _, _, kept = model._encode(b["bert_ids"], b["bert_mask"], b["clip_ids"], True)
    assert kept is None
    torch.testing.assert_close(language_explicit, language_sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(clip_explicit[clip_mask], clip_sdpa[clip_mask], atol=1e-5, rtol=1e-5)


def test_clip_positions_padded_in_every_window_are_dropped_without_changing_results():
    model = tiny_model().eval()
    b = fixed_labels(fake_batch())
    with torch.no_grad():
        _, clip, clip_mask, _, kept = model._encode(b["bert_ids"], b["bert_mask"], b["clip_ids"])
        compact = model(**b)
        full = model(**b, output_attentions=True)  # attention maps keep every position
        _, clip_full = model.encode(b["bert_ids"], b["bert_mask"], b["clip_ids"])
    used = clip_block_mask(b["clip_ids"], EOT).reshape(4, -1).any(0)
    assert kept.tolist() == used.nonzero().squeeze(1).tolist() and len(kept) < 3 * 77 / 2
    assert clip.shape == (4, len(kept), 64) and clip_mask.shape == (4, len(kept))
    for name in ("loss", "mlm_loss", "match_loss", "cliptc_loss"):
        torch.testing.assert_close(compact[name], full[name], atol=1e-5, rtol=1e-5)
    for name in ("mlm_count", "cliptc_count", "mlm_correct", "match_correct", "cliptc_correct"):
        assert compact[name] == full[name]
    assert clip_full.shape == (4, 3 * 77, 64) and (clip_full[:, ~used] == 0).all()


def test_locate_finds_the_clip_layout_and_targets_the_model_would():
    """A batch's layout and target positions, found on the host, are what the model would find itself."""
    b = fake_batch(batch=4, length=16, n_blocks=3)
    out = adaptation_inputs(b, ["mlm", "match", "cliptc"], torch.Generator().manual_seed(0), vocab_size=100,
                            special_ids=[0, CLS, SEP, MASK], mask_id=MASK, eot_id=EOT)
    out = {**out, **locate(out, EOT)}
    fed = clip_block_mask(out["clip_ids"], EOT)
    layout, blocks = out["clip_layout"], fed.reshape(-1, 77)
    assert torch.equal(layout.rows, blocks.any(dim=1).nonzero().squeeze(1))
    assert layout.length == int(blocks.sum(dim=1).max())
    used = fed.reshape(4, -1).any(dim=0)
    assert layout.kept is not None and not used[2 * 77:].any()  # no window uses its third block: dropped
    assert torch.equal(layout.kept, used.nonzero().squeeze(1))
    mlm = out["mlm_labels"].reshape(-1)
    assert torch.equal(mlm[out["mlm_positions"]], mlm[mlm != -100])
    cliptc = out["cliptc_labels"].reshape(4, -1)[:, layout.kept].reshape(-1)
    assert torch.equal(cliptc[out["cliptc_positions"]], cliptc[cliptc != -100])
    assert set(locate({"bert_ids": b["bert_ids"], "bert_mask": b["bert_mask"]}, EOT)) == set()  # nothing to find


def test_a_layout_pins_and_moves_like_a_tensor(monkeypatch):
    """`training.to_device` sends a batch to a GPU as `v.pin_memory().to(device, non_blocking=True)`; a
    layout does the same to its tensors and keeps its length (pinning is faked: this machine has no GPU)."""
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())
    layout = locate(fixed_labels(fake_batch()), EOT)["clip_layout"]
    moved = layout.pin_memory().to("meta", non_blocking=True)
    assert [t.data_ptr() for t in pinned] == [layout.rows.data_ptr(), layout.kept.data_ptr()]
    assert moved.rows.is_meta and moved.kept.is_meta and moved.length == layout.length
    assert moved.rows.shape == layout.rows.shape and moved.kept.shape == layout.kept.shape


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("changes", [{}, {"losses": ["mlm", "match"]}, {"cross_layers": 0, "losses": ["mlm"]},
                                     {"placeholder": True, "losses": ["mlm"]}])
def test_located_batch_gives_the_same_bits_as_the_model_finding_it(changes):
    """A batch that says where its CLIP tokens and targets are (found on the host) trains the same bits
    as one whose model finds them in the tensors (which, on a GPU, waits for the GPU each time)."""
    b = fixed_labels(fake_batch())
    located = {**b, **locate(b, EOT)}
    assert located["clip_layout"].kept is not None and len(located["clip_layout"].rows) == 5
    outs, gradients = [], []
    for batch in (b, located):
        model = tiny_model(**changes)
        if model.cliptc_head is not None:
            model.restrict_cliptc(torch.arange(1000))
        out = model(**batch)
        out["loss"].backward()
        outs.append(out)
        gradients.append(grads(model))
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        assert torch.equal(outs[0][key], outs[1][key]), key
    assert gradients[0].keys() == gradients[1].keys()
    assert all(torch.equal(gradients[0][n], gradients[1][n]) for n in gradients[0])


@pytest.mark.slow
def test_adaptation_forward_and_backward_compile_as_one_graph():
    """Given where its CLIP tokens and targets are, the training forward reads nothing of its data on the
    host: torch.compile traces it whole (fullgraph raises at any break), across batch shapes, and the
    compiled step computes the eager step's bits (Dynamo with the eager backend runs the same kernels)."""
    torch._dynamo.reset()
    eager, compiled = tiny_model(), tiny_model()
    compiled.restrict_cliptc(torch.arange(1000))
    eager.restrict_cliptc(torch.arange(1000))
    step = torch.compile(compiled, backend="eager", fullgraph=True)
    for batch, length, blocks in ((4, 16, 3), (3, 12, 3)):
        b = fixed_labels(fake_batch(batch, length, blocks))
        b = {**b, **locate(b, EOT)}
        expected, got = eager(**b), step(**b)
        expected["loss"].backward()
        got["loss"].backward()
        for key in expected:
            assert torch.equal(expected[key], got[key]), key
        assert all(torch.equal(g, grads(compiled)[n]) for n, g in grads(eager).items())
    with pytest.raises(ValueError, match="output_attentions"):
        eager(**b, output_attentions=True)


def test_language_cls_only_gives_the_same_cls_and_gradients_and_skips_the_rest():
    """Finetuning reads only the language [CLS]: the last layer computes just that, with equal values and
    equal gradients for every parameter (the last layer's CLIP side gets none either way)."""
    b = fake_batch()

    def cls_and_grads(cls_only: bool):
        model = tiny_model().eval()
        calls = []
        model.cross_layers[-1].clip_ffn.register_forward_hook(lambda *a: calls.append(1))
        language, clip = model.encode(**b, language_cls_only=cls_only)
        language[:, 0].pow(2).sum().backward()
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        return language, clip, grads, len(calls)

    language, clip, grads, calls = cls_and_grads(False)
    cls, no_clip, cls_grads, cls_calls = cls_and_grads(True)
    assert cls.shape == (4, 1, 32) and no_clip is None and (calls, cls_calls) == (1, 0)
    torch.testing.assert_close(cls[:, 0], language[:, 0], atol=1e-6, rtol=1e-5)
    assert [n for n, g in grads.items() if g is None] == [n for n, g in cls_grads.items() if g is None]
    assert any(g is None for n, g in grads.items() if n.startswith("cross_layers.1.clip_"))
    for n, g in grads.items():
        if g is not None:
            torch.testing.assert_close(cls_grads[n], g, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")
    with pytest.raises(ValueError, match="cannot return its attention maps"):
        tiny_model()._encode(b["bert_ids"], b["bert_mask"], b["clip_ids"], True, language_cls_only=True)


def test_padding_does_not_change_results():
    """Padding in either stream is invisible: a window alone gives what it gives inside a padded batch."""
    model = tiny_model().eval()
    b = fake_batch()
    with torch.no_grad():
        language, clip = model.encode(**b)
        n = int(b["bert_mask"][3].sum())
        alone_language, alone_clip = model.encode(b["bert_ids"][3:, :n], b["bert_mask"][3:, :n], b["clip_ids"][3:, :1])
    torch.testing.assert_close(alone_language[0], language[3, :n], atol=1e-5, rtol=1e-5)
    valid = clip_block_mask(b["clip_ids"][3, :1], EOT).reshape(-1)
    torch.testing.assert_close(alone_clip[0][valid], clip[3, :77][valid], atol=1e-5, rtol=1e-5)


def test_placeholder_replaces_clip():
    model = tiny_model(losses=["mlm"], placeholder=True).eval()
    assert model.clip is None
    assert count_parameters(model, "clip") == 3 * 77 * 64 == model.placeholder.numel()
    b = fixed_labels(fake_batch())
    other = b["clip_ids"].clone()
    mask = clip_block_mask(other, EOT)
    other[mask & (other != SOT) & (other != EOT)] = 123  # different text, same mask
    with torch.no_grad():
        out = model(**b)
        same = model(**{**b, "clip_ids": other})
    assert torch.isfinite(out["loss"])
    torch.testing.assert_close(out["mlm_loss"], same["mlm_loss"])
    out = model.train()(**b)
    out["loss"].backward()
    assert model.placeholder.grad is not None and model.placeholder.grad.abs().sum() > 0
    for losses in (["mlm", "cliptc"], ["mlm", "match"], ["mlm", "distill"]):
        with pytest.raises(ValueError, match="placeholder"):
            tiny_model(losses=losses, placeholder=True)


@pytest.mark.parametrize("losses", [[], ["mlm", "vc"], ["mlm", "mlm"], "mlm"])
def test_bad_losses_are_rejected(losses):
    with pytest.raises(ValueError, match="mlm, match, cliptc, distill, kl"):
        tiny_config(losses=losses).validate()


def test_init_range_sets_the_new_modules_std_and_only_theirs():
    default, wide = tiny_model(), tiny_model(init_range=0.2)
    assert default.cross_layers[0].language_cross.attention.query.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert wide.cross_layers[0].language_cross.attention.query.weight.std().item() == pytest.approx(0.2, rel=0.1)
    assert wide.match_head.dense.weight.std().item() == pytest.approx(0.2, rel=0.1)
    # the encoder and the CLIP tower are built as before (same seed): only the new modules change
    for part in ("encoder", "clip"):
        a, b = getattr(default, part).state_dict(), getattr(wide, part).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    for bad in (0, -0.1, "0.02", True):
        with pytest.raises(ValueError, match="init_range"):
            tiny_config(init_range=bad).validate()


def test_variants_share_the_initial_weights_of_the_parts_they_share():
    """Table 3 compares losses, so a part two variants both have starts the same in both, whatever else
    each builds first (its heads, a CLIP tower or a placeholder, a second cross layer)."""
    def weights(module):
        return {k: v.clone() for k, v in module.state_dict().items()}

    xdbert = tiny_model()
    others = {"mlm": tiny_model(losses=["mlm"]), "mlm_match": tiny_model(losses=["mlm", "match"]),
              "placeholder": tiny_model(placeholder=True, losses=["mlm"])}
    layers, mlm_head = weights(xdbert.cross_layers), weights(xdbert.mlm_head.dense)
    for name, model in others.items():
        assert all(torch.equal(v, model.cross_layers.state_dict()[k]) for k, v in layers.items()), name
        assert all(torch.equal(v, model.mlm_head.dense.state_dict()[k]) for k, v in mlm_head.items()), name
    assert torch.equal(xdbert.match_head.dense.weight, others["mlm_match"].match_head.dense.weight)
    one = tiny_model(cross_layers=1)
    first = weights(xdbert.cross_layers[0])
    assert all(torch.equal(v, one.cross_layers[0].state_dict()[k]) for k, v in first.items())
    # another seed, other weights; and the parts differ from each other
    assert not torch.equal(tiny_model(seed=1).cross_layers[0].language_cross.attention.query.weight,
                           xdbert.cross_layers[0].language_cross.attention.query.weight)
    assert not torch.equal(xdbert.match_head.dense.weight, xdbert.mlm_head.dense.weight)


def test_mlm_only_baseline_uses_no_clip():
    model = tiny_model(cross_layers=0, losses=["mlm"])
    assert model.clip is None and len(model.cross_layers) == 0
    assert isinstance(model.mlm_head, MaskedTokenHead)
    assert count_parameters(model, "backbone") == count_parameters(model, "encoder")
    b = fixed_labels(fake_batch())
    out = model(b["bert_ids"], b["bert_mask"], mlm_labels=b["mlm_labels"])
    assert set(k for k in out if k.endswith("_loss")) == {"mlm_loss"} and torch.isfinite(out["loss"])
    with pytest.raises(ValueError, match="cross_layers: 0"):
        tiny_config(cross_layers=0, losses=["mlm", "match"]).validate()


def test_each_loss_can_be_overfit():
    model = tiny_model(seed=3).train()
    b = fixed_labels(fake_batch())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    first = None
    for _ in range(40):
        out = model(**b)
        if first is None:
            first = {k: out[f"{k}_loss"].item() for k in ("mlm", "match", "cliptc")}
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        last = model(**b)
    for k in ("mlm", "match", "cliptc"):
        assert last[f"{k}_loss"].item() < 0.5 * first[k], (k, first[k], last[f"{k}_loss"].item())
    assert last["match_correct"] == 4


# ---------------------------------------------------------------- saving

def test_save_adapted_is_a_plain_encoder(tmp_path):
    model = tiny_model().eval()
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n", encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")
    save_adapted(model, tmp_path / "xdbert", tok)
    assert (tmp_path / "xdbert" / "vocab.txt").read_text(encoding="utf-8") == "[PAD]\n[UNK]\n"
    loaded = AutoModel.from_pretrained(tmp_path / "xdbert").eval()
    assert type(loaded) is type(model.encoder)
    assert sum(p.numel() for p in loaded.parameters()) == count_parameters(model, "encoder")
    b = fake_batch()
    with torch.no_grad():
        expected = model.encoder(input_ids=b["bert_ids"], attention_mask=b["bert_mask"])
        got = loaded(input_ids=b["bert_ids"], attention_mask=b["bert_mask"])
    assert torch.equal(expected.last_hidden_state, got.last_hidden_state)
    assert torch.equal(expected.pooler_output, got.pooler_output)
    with pytest.raises(PipelineError, match="tokenize"):
        save_adapted(model, tmp_path / "other", tmp_path / "missing")


@pytest.mark.parametrize("changes", [{}, {"losses": ["mlm"], "placeholder": True}, {"cross_layers": 0, "losses": ["mlm"]}])
def test_save_full_round_trip_is_exact(tmp_path, changes):
    model = tiny_model(seed=5, **changes)
    with torch.no_grad():  # move every parameter off its initial value so a missed one shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.eval()
    save_full(model, tmp_path / "full")
    loaded = load_full(tmp_path / "full").eval()
    assert loaded.config == model.config
    assert count_parameters(loaded, "all") == count_parameters(model, "all")
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q), name
    assert loaded.mlm_head.decoder.weight is loaded.encoder.get_input_embeddings().weight
    b = fixed_labels(fake_batch())
    if model.config.cross_layers == 0:
        b = {k: b[k] for k in ("bert_ids", "bert_mask", "mlm_labels")}
    with torch.no_grad():
        expected, got = model(**b), loaded(**b)
    assert torch.equal(expected["loss"], got["loss"])
    # The same weights give the same bytes (DVC must see an unchanged model as unchanged): safetensors'
    # save_model metadata listed the tied decoders in an order that changed from save to save.
    for i in range(4):
        save_full(model, tmp_path / f"again{i}")
        assert (tmp_path / f"again{i}" / "model.safetensors").read_bytes() == (tmp_path / "full" / "model.safetensors").read_bytes()


def test_damaged_saved_models_are_named_in_one_error(tmp_path):
    """A cut-short weights file or a missing config gives a PipelineError naming the file, not a traceback
    from safetensors or transformers (the analyses load these folders directly)."""
    from xdbert.model.saving import load_clip_tower, save_clip_tower

    model = tiny_model(seed=5)
    save_full(model, tmp_path / "full")
    save_clip_tower(model.clip, tmp_path / "clip", model.config.clip)
    BertForMaskedLM(AutoConfig.for_model("bert", vocab_size=100, **TINY_BERT)).save_pretrained(tmp_path / "bert")
    for folder in ("full", "clip", "bert"):
        weights = tmp_path / folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:500])
    with pytest.raises(PipelineError, match="model file .*full/model.safetensors is missing or damaged"):
        load_full(tmp_path / "full")
    with pytest.raises(PipelineError, match="model file .*clip/model.safetensors is missing or damaged"):
        load_clip_tower(tmp_path / "clip")
    with pytest.raises(PipelineError, match="model file .*bert/model.safetensors is missing or damaged"):
        build_language_encoder(str(tmp_path / "bert"))
    (tmp_path / "full" / "encoder" / "config.json").unlink()
    with pytest.raises(PipelineError, match="missing file .*full/encoder/config.json"):
        load_full(tmp_path / "full")
    # a config the model code refuses (a ValueError there) is named by its file
    config = tmp_path / "full" / "xdbert_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "cross_layers": -1}))
    with pytest.raises(PipelineError, match=r"full/xdbert_config.json: `cross_layers` must be an integer >= 0; got -1; "
                                            r"rerun the stage that wrote it$"):
        load_full(tmp_path / "full")
    config.write_text(json.dumps({**json.loads(config.read_text()), "cross_layers": 2, "heads": 4}))
    with pytest.raises(PipelineError, match=r"full/xdbert_config.json: unknown XDBERT config keys \['heads'\]"):
        load_full(tmp_path / "full")

def test_unknown_clip_name_and_strip_heads():
    with pytest.raises(PipelineError, match="unknown CLIP model"):
        XDBertModel.build(tiny_config(clip="nosuch-clip"))
    model = tiny_model().strip_heads()
    assert count_parameters(model, "all") == count_parameters(model, "backbone")
    b = fixed_labels(fake_batch())
    assert "loss" not in model(**b)


def test_bf16_autocast_forward_and_backward():
    model = tiny_model()
    b = fixed_labels(fake_batch())
    for output_attentions in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**b, output_attentions=output_attentions)
        assert torch.isfinite(out["loss"]) and out["loss"].dtype == torch.float32
        out["loss"].backward()


def test_clip_heads_that_do_not_divide_the_towers_width_are_refused_before_the_build():
    """The model code knows no params key: the adapt stage names it (tests/test_adaptation.py's bad input)."""
    from xdbert.model.build import check_clip_heads

    check_clip_heads("xdbert-tiny", 2)
    with pytest.raises(ValueError, match=r"^3 does not divide the width 64 "
                                         r"of CLIP's text tower `xdbert-tiny`; allowed: 1, 2, 4, 8, 16, 32, 64$"):
        check_clip_heads("xdbert-tiny", 3)
