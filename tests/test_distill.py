"""The encoder-side positive control `distill` (issue 55): a linear map of the encoder's states before the cross
layers pulled by 1 - cosine towards the CLIP tower's detached states at aligned tokens.

Its targets (only own-text windows, only aligned tokens that are no MLM target), the loss on a constructed case,
training lowering it, no gradient into CLIP, the settings, and the defaults unchanged: the same numbers as the
main branch's code for a fixed seed and batch.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from xdbert import training
from xdbert.adaptation.loop import BatchMaker, _sum_counts, read_counts, summarize, weighted_loss
from xdbert.adaptation.masking import distill_targets
from xdbert.adaptation.settings import AdaptSettings
from xdbert.errors import PipelineError
from xdbert.model import IGNORE_INDEX
from xdbert.model import controls
from xdbert.model.modeling import PARTS, XDBertConfig, XDBertModel, count_parameters, locate, target_positions
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")
SOT, EOT = 49406, 49407
CLS, SEP, MASK, VOCAB = 2, 3, 4, 100
SPECIAL = [0, 1, CLS, SEP, MASK]
TINY_BERT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
PAPER = ["mlm", "match", "cliptc"]
DISTILL = [*PAPER, "distill"]
N = IGNORE_INDEX
WEIGHTS = {"mlm": 1.0, "match": 10.0, "cliptc": 1.0, "distill": 1.0}


def rows(n: int = 4, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Shard rows of one CLIP block: window i has 5 + i words; BERT token p (1..k) is aligned with CLIP
    position p alone; [CLS], [SEP] and padding with none (-1)."""
    rng = np.random.default_rng(seed)
    bert, clip = np.zeros((n, length), np.int64), np.zeros((n, 77), np.int64)
    start, end = np.full((n, length), -1, np.int64), np.full((n, length), -1, np.int64)
    lens = np.zeros(n, np.int64)
    for i in range(n):
        k = 5 + i
        bert[i, 0], bert[i, 1:k + 1], bert[i, k + 1] = CLS, rng.integers(5, VOCAB, k), SEP
        clip[i, 0], clip[i, 1:k + 1], clip[i, k + 1] = SOT, rng.integers(0, 900, k), EOT
        start[i, 1:k + 1], end[i, 1:k + 1] = np.arange(1, k + 1), np.arange(2, k + 2)
        lens[i] = k + 2
    return {"bert_ids": bert, "bert_mask": (np.arange(length) < lens[:, None]).astype(np.uint8), "clip_ids": clip,
            "align_start": start, "align_end": end}


def settings(losses=PAPER, **kw) -> AdaptSettings:
    """The embedded profile's `xdbert` variant, one micro-batch of 4 windows."""
    s = AdaptSettings.from_params(values("embedded"), "xdbert")
    weights = WEIGHTS if "distill" in losses else s.loss_weights
    return dataclasses.replace(s, losses=list(losses), micro_batch_size=4, batch_size=4, loss_weights=weights, **kw)


def model(losses=PAPER, seed: int = 0) -> XDBertModel:
    torch.manual_seed(seed)  # as build_xdbert does: the new parts' initial weights are a function of it
    return XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=TINY_BERT, vocab_size=VOCAB,
                                          clip="xdbert-tiny", clip_heads=2, clip_blocks=1, cross_layers=1,
                                          losses=list(losses), clip_eot_id=EOT))


def batch(s: AdaptSettings, step: int = 3, j: int = 1) -> tuple[dict, torch.Generator]:
    """The batch micro-batch j of `step` gets in the loop, and its generator after drawing it."""
    make = BatchMaker(s, 1, vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, eot_id=EOT)
    gen = training.generator(s.seed, step, j)
    return make(rows(), gen), gen


# ---------------------------------------------------------------------------------------------------
# 1. The targets: own-text windows, real aligned tokens, no MLM target
# ---------------------------------------------------------------------------------------------------

def test_targets_are_the_last_aligned_clip_position_of_real_tokens_in_own_text_windows():
    start = torch.tensor([[-1, 1, 2, 4, 5, -1, -1], [-1, 1, 3, -1, -1, -1, -1]])
    end = torch.tensor([[-1, 2, 4, 5, 5, -1, -1], [-1, 3, 4, -1, -1, -1, -1]])  # (0, 4): an empty range
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    mlm = torch.full_like(start, IGNORE_INDEX)
    mlm[0, 2] = 7
    assert distill_targets(start, end, mask).tolist() == [[N, 1, 3, 4, N, N, N], [N, 2, 3, N, N, N, N]]
    assert distill_targets(start, end, mask, torch.tensor([1, 0]), mlm).tolist() == [[N, 1, N, 4, N, N, N], [N] * 7]
    # padding with an alignment (as no shard writes it) is still no target
    assert distill_targets(start, end, torch.zeros_like(mask)).eq(N).all()


def test_the_batch_pulls_only_positive_windows_and_aligned_unmasked_tokens():
    b, _ = batch(settings(DISTILL))
    r = rows()
    labels, own = b["distill_labels"], b["match_labels"].bool()
    assert not own.all() and own.any()  # both kinds of window in this batch
    target = labels != IGNORE_INDEX
    aligned = torch.from_numpy(r["align_start"] >= 0) & torch.from_numpy(r["bert_mask"].astype(bool))
    assert torch.equal(target, aligned & own[:, None] & (b["mlm_labels"] == IGNORE_INDEX))
    assert torch.equal(labels[target], torch.from_numpy(r["align_end"] - 1)[target])
    assert torch.equal(b["distill_positions"], target.reshape(-1).nonzero().squeeze(1))


# ---------------------------------------------------------------------------------------------------
# 2. The loss
# ---------------------------------------------------------------------------------------------------

def test_the_loss_is_zero_when_the_map_reproduces_the_targets_and_reads_the_aligned_rows():
    m = model(DISTILL)
    width, clip_width = m.distill_map.in_features, m.distill_map.out_features
    g = torch.Generator().manual_seed(1)
    language = torch.randn(2, 6, width, generator=g)
    labels = torch.tensor([[N, 3, 1, N, 70, N], [N, 0, N, 5, N, N]])
    # CLIP states made by a known affine map of the language states at each label's position, noise elsewhere
    weight, bias = torch.randn(clip_width, width, generator=g), torch.randn(clip_width, generator=g)
    clip = torch.randn(2, 77, clip_width, generator=g)
    for i, p in (labels != N).nonzero().tolist():
        clip[i, labels[i, p]] = language[i, p] @ weight.T + bias
    with torch.no_grad():
        m.distill_map.weight.copy_(weight)
        m.distill_map.bias.copy_(bias)
    def loss(labels):  # what the forward computes from its states (xdbert.model.controls)
        out, positions = {}, target_positions(labels)
        m._control_loss(out, "distill", controls.distill_distance(m.distill_map, language, clip, labels, positions), positions)
        return out["distill_loss"].item(), out["distill_count"].item()

    assert loss(labels)[0] < 1e-6 and loss(labels)[1] == 5
    assert loss(labels.roll(1, dims=0))[0] > 0.3  # the same positions of the other window
    assert loss(torch.full_like(labels, N)) == (0, 0)  # no targets: 0, not NaN


def test_a_few_steps_lower_it():
    s = settings(DISTILL)
    m = model(DISTILL)
    b, _ = batch(s)
    optimizer = torch.optim.AdamW(m.parameters(), lr=1e-3)
    losses = []
    for step in range(20):
        torch.manual_seed(step)
        out = m(**b)
        losses.append(out["distill_loss"].item())
        optimizer.zero_grad()
        weighted_loss(out, s.loss_weights).backward()
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_targets_carry_no_gradient_into_clip():
    m = model(DISTILL)
    b, _ = batch(settings(DISTILL))
    out = m(**{k: v for k, v in b.items() if k not in ("mlm_labels", "match_labels", "cliptc_labels")})
    assert set(k for k in out if k.endswith("_loss")) == {"distill_loss"}
    out["loss"].backward()
    assert all(p.grad is None or not p.grad.any() for p in m.clip.parameters())
    assert m.distill_map.weight.grad.any() and m.encoder.get_input_embeddings().weight.grad.any()


def test_the_counts_give_a_distill_loss_and_no_accuracy():
    s = settings(DISTILL)
    b, _ = batch(s)
    with torch.no_grad():
        out = model(DISTILL)(**b)
    totals = {}
    _sum_counts(out, totals)
    metrics = summarize(read_counts(totals, s.losses, "cpu"))
    assert metrics["distill_loss"] == pytest.approx(out["distill_loss"].item())
    assert "distill_accuracy" not in metrics and {"mlm_accuracy", "match_accuracy", "cliptc_accuracy"} <= set(metrics)


# ---------------------------------------------------------------------------------------------------
# 3. The settings: a variant turns it on, with its weight
# ---------------------------------------------------------------------------------------------------

def with_variant(**override) -> dict:
    p = copy.deepcopy(values("embedded"))
    p["adapt"]["variants"]["distill"] = override
    return p


def test_a_variant_with_distill_and_its_weight_is_accepted():
    s = AdaptSettings.from_params(with_variant(losses=DISTILL, loss_weights=WEIGHTS), "distill")
    assert s.losses == DISTILL and s.loss_weights["distill"] == 1.0


@pytest.mark.parametrize("override, message", [
    ({"losses": DISTILL}, "`adapt.loss_weights` must give distill a weight while `adapt.variants.distill.losses` has distill"),
    ({"losses": DISTILL, "loss_weights": None}, "`adapt.variants.distill.loss_weights` must give distill a weight"),
    ({"losses": ["mlm", "distill"], "placeholder": True, "loss_weights": WEIGHTS},
     "`adapt.variants.distill.placeholder: true` has no CLIP tower whose states distill could target"),
    ({"losses": ["mlm", "itm"]}, "allowed: mlm, match, cliptc, distill, kl"),
])
def test_a_distill_variant_without_what_it_needs_is_refused(override, message):
    with pytest.raises(PipelineError, match=message.replace("[", r"\[")):
        AdaptSettings.from_params(with_variant(**override), "distill")


# ---------------------------------------------------------------------------------------------------
# 4. Off by default: the defaults compute what they did before it
# ---------------------------------------------------------------------------------------------------

# The main branch's numbers (commit e22a0a5, before distill existed) for `defaults_run`, as float.hex.
MAIN = {"cliptc_loss": "0x1.58ad280000000p+3", "match_loss": "0x1.5f16d60000000p-1", "mlm_loss": "0x1.29ab560000000p+2",
        "loss": "0x1.01ba200000000p+4", "weighted": "0x1.64788c0000000p+4", "grad_norm": "0x1.88f330f574714p+3",
        "next_draw": "0x1.18894c0000000p-2", "params_encoder": 14976, "params_clip": 3271233, "params_cross": 52768,
        "params_heads": 56038, "params_backbone": 3338977, "params_all": 3395015}


def defaults_run(s: AdaptSettings) -> dict:
    """The default losses' micro-batch 1 of step 3: its losses, weighted loss, gradient norm, the generator's
    next draw and the parameter counts."""
    m = model(s.losses)
    b, gen = batch(s)
    torch.manual_seed(training.step_seed(s.seed, 3, 1))  # dropout, as the loop seeds it
    out = m(**b)
    loss = weighted_loss(out, s.loss_weights)
    loss.backward()
    grad = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters() if p.grad is not None))
    return {**{k: out[k].item().hex() for k in out if k.endswith("_loss")}, "loss": out["loss"].item().hex(),
            "weighted": loss.item().hex(), "grad_norm": grad.item().hex(),
            "next_draw": torch.rand(1, generator=gen).item().hex(), **{f"params_{p}": count_parameters(m, p) for p in PARTS}}


def test_the_defaults_compute_what_main_computed():
    s = settings()
    assert s.losses == PAPER and "distill" not in s.loss_weights  # the embedded profile's defaults
    b, _ = batch(s)
    assert "distill_labels" not in b and "align_start" not in b and "distill_positions" not in b
    assert model().distill_map is None and XDBertConfig().losses == PAPER
    assert defaults_run(s) == MAIN


def test_adding_distill_changes_nothing_the_other_losses_compute():
    plain, distill = model(), model(DISTILL)
    shared = plain.state_dict()
    assert {k for k in distill.state_dict() if k not in shared} == {"distill_map.weight", "distill_map.bias"}
    assert all(torch.equal(v, distill.state_dict()[k]) for k, v in shared.items())
    assert count_parameters(distill, "backbone") == count_parameters(plain, "backbone")
    b, _ = batch(settings(DISTILL))
    outs = []
    for m in (plain, distill):
        torch.manual_seed(0)
        outs.append(m(**b))
    assert all(torch.equal(outs[0][f"{k}_loss"], outs[1][f"{k}_loss"]) for k in PAPER)
    assert "distill_loss" not in outs[0] and outs[1]["distill_count"].item() > 0
