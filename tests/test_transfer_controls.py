"""Rung T's controls (issue 68), the encoder pulled towards CLIP's tower with no cross layer. Mostly `kl`: at a masked token t+1 of a corpus window the encoder's MLM distribution is
pulled (KL, the tower's side detached) towards the CLIP tower's next-token distribution at token t, over the
words both vocabularies hold as one token; no cross layer, so nothing else reaches the encoder from CLIP.

Its targets (a subset of MLM's, only where the tower's next token is the whole word), the loss (zero when the two
distributions agree), no gradient into the tower, the settings, the shared vocabulary, and the rung's point: an
encoder distilled from one tower learns that tower's expectations, not another's (T FAILS with the twin's).
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.test_distill import EOT, MASK, SPECIAL, TINY_BERT, VOCAB, rows
from xdbert import training
from xdbert.adaptation.loop import BatchMaker, weighted_loss
from xdbert.adaptation.masking import kl_targets
from xdbert.adaptation.settings import AdaptSettings
from xdbert.errors import PipelineError
from xdbert.model import IGNORE_INDEX
from xdbert.model import controls
from xdbert.model.modeling import XDBertConfig, XDBertModel, target_positions
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")
N = IGNORE_INDEX
KL = ["mlm", "kl"]
SHARED = list(range(5, VOCAB))  # every non-special id of the tiny vocabulary is a shared word here


def settings(**kw) -> AdaptSettings:
    s = AdaptSettings.from_params(values("embedded"), "distill_kl")
    return dataclasses.replace(s, micro_batch_size=4, batch_size=4, **kw)


def model(seed: int = 0, clip_ids=None) -> XDBertModel:
    torch.manual_seed(seed)
    m = XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=TINY_BERT, vocab_size=VOCAB,
                                       clip="xdbert-tiny", clip_heads=2, clip_blocks=1, cross_layers=0, losses=KL,
                                       clip_eot_id=EOT))
    return controls.restrict_kl(m, torch.tensor(SHARED), torch.tensor(clip_ids if clip_ids is not None else SHARED))


def batch(step: int = 3, data: dict | None = None) -> dict:
    make = BatchMaker(settings(), 1, vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, eot_id=EOT, kl_ids=SHARED)
    return make(data or rows(), training.generator(0, step, 0))


# ---------------------------------------------------------------------------------------------------
# 1. The targets
# ---------------------------------------------------------------------------------------------------

def test_targets_are_mlm_targets_whose_tower_next_token_is_the_whole_word():
    # BERT tokens 1..6 on CLIP positions: token 3 is "play" of "play ##ing" (both pieces on CLIP position 3);
    # token 5 is two CLIP tokens; token 6 ends the window
    start = torch.tensor([[-1, 1, 2, 3, 3, 4, 6, -1]])
    end = torch.tensor([[-1, 2, 3, 4, 4, 6, 7, -1]])
    every = torch.tensor([[N, 10, 11, 12, 13, 14, 15, N]])
    assert kl_targets(start, end, every, SHARED).tolist() == [[N, N, 1, N, N, N, 5, N]]
    # only MLM targets, only words of the shared vocabulary
    some = torch.tensor([[N, 10, N, 12, 13, 14, 15, N]])
    assert kl_targets(start, end, some, SHARED).tolist() == [[N, N, N, N, N, N, 5, N]]
    assert kl_targets(start, end, every, [11]).tolist() == [[N, N, 1, N, N, N, N, N]]
    # the token before in another CLIP block (77 positions each): its next token is the block's [EOT]
    assert kl_targets(start, end, every, SHARED, context=6).tolist() == [[N, N, 1, N, N, N, N, N]]


def test_the_batch_adds_kl_targets_without_changing_mlm_masking():
    plain = BatchMaker(dataclasses.replace(settings(), losses=["mlm"]), 1, vocab_size=VOCAB, special_ids=SPECIAL,
                       mask_id=MASK, eot_id=EOT)(rows(), training.generator(0, 3, 0))
    b = batch()
    assert torch.equal(b["bert_ids"], plain["bert_ids"]) and torch.equal(b["mlm_labels"], plain["mlm_labels"])
    targets = b["kl_labels"] != N
    assert targets.any() and (b["mlm_labels"][targets] != N).all()
    # rows(): BERT token p sits on CLIP position p, so the target of token p is the position of token p - 1
    p = targets.nonzero()
    assert torch.equal(b["kl_labels"][targets], p[:, 1] - 1)


# ---------------------------------------------------------------------------------------------------
# 2. The loss
# ---------------------------------------------------------------------------------------------------

def test_the_loss_is_zero_where_the_encoder_expects_what_the_tower_does():
    m = model()
    g = torch.Generator().manual_seed(1)
    width = m.encoder.config.hidden_size
    language = torch.randn(2, 6, width, generator=g)
    labels = torch.tensor([[N, 3, N, 5, N, N], [N, N, 2, N, N, N]])
    clip = torch.randn(2, 77, m.clip.width, generator=g)
    def loss(labels):  # what the forward computes from its states (xdbert.model.controls)
        out, positions = {}, target_positions(labels)
        summed = controls.kl_divergence(m.mlm_head, m.kl_encoder_ids, m.clip.token_embedding.weight, m.kl_clip_ids,
                                        language, clip, labels, positions)
        m._control_loss(out, "kl", summed, positions)
        return out["kl_loss"].item(), out["kl_count"].item()

    assert loss(labels)[0] > 0 and loss(labels)[1] == 3
    # make the MLM head's distribution over the shared words the tower's, at every target
    with torch.no_grad():
        m.clip.token_embedding.weight.zero_()
        m.mlm_head.bias.zero_()
        m.mlm_head.decoder.weight.zero_()
    assert abs(loss(labels)[0]) < 1e-6  # both uniform
    assert loss(torch.full_like(labels, N)) == (0, 0)  # no targets: 0, not NaN


def test_training_lowers_it_and_no_gradient_reaches_the_tower():
    m = model()
    with torch.no_grad():
        m.clip.token_embedding.weight.mul_(20)  # sharp expectations, as a trained language model has
    b = batch()
    tower = {k: v.clone() for k, v in m.clip.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(40):
        out = m(**b)
        losses.append(out["kl_loss"].item())
        optimizer.zero_grad()
        weighted_loss(out, None).backward()  # MLM and kl, as the loop trains them
        optimizer.step()
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(p.grad is None for p in m.clip.parameters())
    assert all(torch.equal(v, m.clip.state_dict()[k]) for k, v in tower.items())


def test_a_control_learns_its_own_tower_and_not_the_twin_tower():
    """The rung's point in small: two towers that expect different next words. An encoder distilled from the
    first predicts at a [MASK] what the first expects, far more often than what the second does; distilled
    from the second, the reverse. T with the tower's distribution replaced by the twin's reads nothing."""
    data = rows(n=8, length=14, seed=3)

    def expectations(m, b):
        target = b["kl_labels"] != N
        with torch.no_grad():  # the tower's next-token argmax and the encoder's MLM argmax over the shared words
            language = m.encoder(input_ids=b["bert_ids"], attention_mask=b["bert_mask"]).last_hidden_state
            clip = m.clip(b["clip_ids"], b["clip_ids"] != 0)
        rows_ = language[target]
        states = clip.reshape(-1, clip.shape[-1])[(target.nonzero()[:, 0] * clip.shape[1]) + b["kl_labels"][target]]
        tower = (states @ m.clip.token_embedding.weight[m.kl_clip_ids].T).argmax(-1)
        encoder = m.mlm_head(rows_, m.kl_encoder_ids).argmax(-1)
        return tower, encoder

    def distilled(tower_seed: int) -> XDBertModel:
        m = model()
        torch.manual_seed(tower_seed)  # another tower: its own random next-token expectations
        fresh = XDBertModel.build(m.config).clip
        m.clip.load_state_dict(fresh.state_dict())
        with torch.no_grad():
            m.clip.token_embedding.weight.mul_(20)  # sharp expectations, as a trained language model has
        optimizer = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
        for step in range(200):
            b = batch(step, data)
            out = m(**b)
            optimizer.zero_grad()
            out["kl_loss"].backward()  # kl alone: what the encoder learns here, it learns from the tower
            optimizer.step()
        return m

    own, twin = distilled(1), distilled(2)
    agree_own = agree_twin = n = 0
    for step in range(1000, 1010):  # maskings never trained on
        b = batch(step, data)
        own_tower, own_encoder = expectations(own, b)
        twin_tower, _ = expectations(twin, b)
        agree_own += (own_encoder == own_tower).sum().item()
        agree_twin += (own_encoder == twin_tower).sum().item()
        n += len(own_tower)
    assert agree_own / n > 0.5 and agree_twin / n < 0.2, (agree_own, agree_twin, n)


# ---------------------------------------------------------------------------------------------------
# 3. The settings and the shared vocabulary
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("control, loss", [("distill_kl", "kl"), ("distill_cos", "distill")])
def test_the_embedded_variants_are_the_baseline_with_a_control_beside_each_tower(control, loss):
    p = values("embedded")
    baseline = AdaptSettings.from_params(p, "baseline")
    real, twin = (AdaptSettings.from_params(p, v) for v in (control, f"{control}_nofacts"))
    assert real.losses == twin.losses == ["mlm", loss] and real.cross_layers == twin.cross_layers == 0
    assert (real.clip_tower, twin.clip_tower) == ("pretrain_clip", "pretrain_clip_nofacts")
    same = {f.name for f in dataclasses.fields(AdaptSettings)} - {"losses", "clip_tower", "loss_weights"}
    assert all(getattr(real, k) == getattr(baseline, k) for k in same), \
        [k for k in same if getattr(real, k) != getattr(baseline, k)]


def test_distill_without_cross_layers_runs_the_frozen_tower_for_its_targets():
    torch.manual_seed(0)
    m = XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=TINY_BERT, vocab_size=VOCAB,
                                       clip="xdbert-tiny", clip_heads=2, clip_blocks=1, cross_layers=0,
                                       losses=["mlm", "distill"], clip_eot_id=EOT))
    assert len(m.cross_layers) == 0 and not any(p.requires_grad for p in m.clip.parameters())
    s = dataclasses.replace(settings(), losses=["mlm", "distill"], loss_weights={"distill": 1.0})
    b = BatchMaker(s, 1, vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, eot_id=EOT)(rows(), training.generator(0, 3, 0))
    out = m(**b)
    assert out["distill_count"].item() > 0 and 0 < out["distill_loss"].item() < 2
    weighted_loss(out, s.loss_weights).backward()
    assert m.distill_map.weight.grad.any() and all(p.grad is None for p in m.clip.parameters())


@pytest.mark.parametrize("override, message", [
    ({"losses": ["kl"], "cross_layers": 0}, r"allows only `adapt.variants.distill_kl.losses: \[mlm\]` with distill or kl"),
    ({"losses": ["mlm", "kl"], "placeholder": True}, "has kl, which pulls the MLM head towards CLIP's tower: it needs mlm and no placeholder"),
])
def test_a_kl_variant_without_what_it_needs_is_refused(override, message):
    p = copy.deepcopy(values("embedded"))
    p["adapt"]["variants"]["distill_kl"] = override
    with pytest.raises(PipelineError, match=message):
        AdaptSettings.from_params(p, "distill_kl")


def test_the_shared_vocabulary_is_the_whole_words_each_tokenizer_holds_as_one_token(tmp_path):
    from transformers import BertTokenizerFast

    from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
    from xdbert.data.tokenization.word_ids import shared_single_ids

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "kite", "striped", "##s", "zzqxv", "the"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(str(tmp_path / "vocab.txt"))
    clip = clip_fast_tokenizer("xdbert-tiny")
    encoder_ids, clip_ids = shared_single_ids(tok, clip)
    kept = tok.convert_ids_to_tokens(encoder_ids)
    assert kept == ["kite", "striped", "the"]  # no special, no ## piece, no word CLIP cuts in pieces
    assert clip_ids == [clip.encode(w, add_special_tokens=False).ids[0] for w in kept]
    assert shared_single_ids(tok, clip, clip_ids[1:])[0] == encoder_ids[1:]  # the tower's known ids alone
