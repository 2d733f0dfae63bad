"""Targets of MLM, MATCH and CLIPTC: proportions, what may never be a target, determinism."""
from __future__ import annotations

import torch

from xdbert.clip import clip_block_mask
from xdbert.adaptation.masking import adaptation_inputs, choose_exact, choose_match_negatives, cliptc_targets, mask_for_mlm

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = (PAD, UNK, CLS, SEP, MASK)
VOCAB = 1000
SOT, EOT = 49406, 49407


def bert_batch(batch=512, length=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    lengths = torch.randint(8, length + 1, (batch,), generator=g)
    positions = torch.arange(length)
    mask = (positions < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(batch), lengths - 1] = SEP
    ids[mask == 0] = PAD
    ids[:, 5] = torch.where(mask[:, 5].bool(), UNK, PAD)  # a special token inside the text
    return ids, mask


def clip_batch(batch=64, n_blocks=3, seed=0):
    """Used blocks of random lengths (content may contain id 0), unused blocks all zero."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(batch, n_blocks, 77, dtype=torch.long)
    used_blocks = torch.randint(1, n_blocks + 1, (batch,), generator=g)
    content = torch.randint(1, 76, (batch, n_blocks), generator=g)
    for i in range(batch):
        for j in range(int(used_blocks[i])):
            n = int(content[i, j])
            ids[i, j, 0] = SOT
            ids[i, j, 1:n + 1] = torch.randint(0, 300, (n,), generator=g)  # 0 is the real token "!"
            ids[i, j, n + 1] = EOT
    return ids


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- MLM

def test_mlm_share_and_80_10_10():
    ids, mask = bert_batch()
    inputs, labels = mask_for_mlm(ids, mask, vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, generator=gen())
    eligible = mask.bool() & ~torch.isin(ids, torch.tensor(SPECIAL))
    target = labels != -100
    # Exactly round(15%) of each window's eligible tokens (at least one).
    expected = torch.round(eligible.sum(-1).double() * 0.15).long().clamp(min=1)
    assert torch.equal(target.sum(-1), expected)
    assert torch.equal(labels[target], ids[target])
    assert torch.equal(inputs[~target], ids[~target])  # nothing else changes
    n = target.sum().item()
    masked = (inputs[target] == MASK).sum().item() / n
    unchanged = (inputs[target] == ids[target]).sum().item() / n
    replaced = 1 - masked - unchanged
    assert abs(masked - 0.8) < 0.01 and abs(replaced - 0.1) < 0.01 and abs(unchanged - 0.1) < 0.01
    # Random replacements are ordinary tokens, never specials.
    random_tokens = inputs[target & (inputs != MASK) & (inputs != ids)]
    assert not torch.isin(random_tokens, torch.tensor(SPECIAL)).any() and (random_tokens < VOCAB).all()


def test_focus_words_are_targets_at_their_own_rate_and_off_leaves_the_batches_alone():
    """The upper reference's attribute words (issue 68): each one a target with `focus_prob`, the other tokens at
    `prob`; with no focus no extra number is drawn, so every other variant's batches stay byte for byte."""
    ids, mask = bert_batch()
    focus = [10, 11, 12, 13]
    ids[:, 7] = torch.where(mask[:, 7].bool(), torch.tensor(focus)[torch.arange(len(ids)) % 4], PAD)
    kw = dict(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK)
    _, labels = mask_for_mlm(ids, mask, generator=gen(), focus_ids=focus, focus_prob=0.5, **kw)
    is_focus = torch.isin(ids, torch.tensor(focus)) & mask.bool()
    rate = (labels[is_focus] != -100).double().mean().item()
    others = mask.bool() & ~torch.isin(ids, torch.tensor(SPECIAL)) & ~is_focus
    assert abs(rate - 0.5) < 0.06 and is_focus.sum() > 500
    assert abs((labels[others] != -100).double().mean().item() - 0.15) < 0.01
    plain = mask_for_mlm(ids, mask, generator=gen(), **kw)
    for off in ({"focus_ids": focus, "focus_prob": 0.0}, {"focus_ids": (), "focus_prob": 0.5}):
        assert all(torch.equal(a, b) for a, b in zip(plain, mask_for_mlm(ids, mask, generator=gen(), **kw, **off)))


def test_mlm_never_targets_specials_or_padding():
    ids, mask = bert_batch()
    _, labels = mask_for_mlm(ids, mask, vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, generator=gen(1))
    target = labels != -100
    assert not target[mask == 0].any()
    assert not torch.isin(ids[target], torch.tensor(SPECIAL)).any()


def test_mlm_is_deterministic_given_the_generator():
    ids, mask = bert_batch(batch=32)
    kw = dict(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK)
    a = mask_for_mlm(ids, mask, generator=gen(7), **kw)
    b = mask_for_mlm(ids, mask, generator=gen(7), **kw)
    c = mask_for_mlm(ids, mask, generator=gen(8), **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_choose_exact_uniform_over_eligible_positions():
    eligible = torch.zeros(20000, 10, dtype=torch.bool)
    eligible[:, 2:7] = True
    chosen = choose_exact(eligible, 0.4, gen())
    assert torch.equal(chosen.sum(-1), torch.full((20000,), 2))
    share = chosen.float().mean(0)
    assert (share[[0, 1, 7, 8, 9]] == 0).all()
    assert torch.allclose(share[2:7], torch.full((5,), 0.4), atol=0.02)
    assert not choose_exact(torch.zeros(3, 4, dtype=torch.bool), 0.15, gen()).any()


# ---------------------------------------------------------------- MATCH

def test_match_negatives_are_never_the_window_itself():
    clip = clip_batch(batch=64)
    shuffled, labels = choose_match_negatives(clip, gen())
    assert shuffled.shape == clip.shape and labels.dtype == torch.long
    same = (shuffled == clip).flatten(1).all(-1)
    assert torch.equal(labels, same.long())
    assert 0.3 < (labels == 0).float().mean() < 0.7
    # Each negative is a real other window of the batch.
    for i in torch.nonzero(labels == 0).flatten().tolist():
        assert any(torch.equal(shuffled[i], clip[j]) for j in range(64) if j != i)


def test_match_negatives_over_many_draws():
    clip = torch.arange(8).repeat_interleave(3 * 77).reshape(8, 3, 77)  # every window distinct
    labels = torch.stack([choose_match_negatives(clip, gen(s))[1] for s in range(300)])
    assert abs((labels == 0).float().mean().item() - 0.5) < 0.03
    _, all_negative = choose_match_negatives(clip, gen(), prob=1.0)
    assert (all_negative == 0).all()


def test_match_batch_of_one_has_no_negative():
    clip = clip_batch(batch=1)
    shuffled, labels = choose_match_negatives(clip, gen(), prob=1.0)
    assert torch.equal(shuffled, clip) and labels.tolist() == [1]


def test_match_is_deterministic():
    clip = clip_batch(batch=16)
    a, b = choose_match_negatives(clip, gen(3)), choose_match_negatives(clip, gen(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------- CLIPTC

def test_cliptc_targets_only_real_content():
    clip = clip_batch(batch=256)
    mask = clip_block_mask(clip, EOT)
    labels = cliptc_targets(clip, mask, gen())
    target = labels != -100
    assert labels.shape == clip.shape
    assert torch.equal(labels[target], clip[target])
    assert not target[~mask].any()  # no padding, no unused block
    assert not torch.isin(clip[target], torch.tensor([SOT, EOT])).any()
    assert not target[..., 0].any()
    content = mask & (clip != SOT) & (clip != EOT)
    expected = torch.round(content.flatten(1).sum(-1).double() * 0.15).long().clamp(min=1)
    assert torch.equal(target.flatten(1).sum(-1), expected)
    assert (clip[target] == 0).any()  # "!" (id 0) is real content and can be a target


def test_cliptc_is_deterministic():
    clip = clip_batch(batch=16)
    mask = clip_block_mask(clip, EOT)
    assert torch.equal(cliptc_targets(clip, mask, gen(4)), cliptc_targets(clip, mask, gen(4)))


# ---------------------------------------------------------------- batches

def test_adaptation_inputs():
    ids, mask = bert_batch(batch=6, length=32)
    clip = clip_batch(batch=6)
    batch = {"bert_ids": ids, "bert_mask": mask.long(), "clip_ids": clip}
    kw = dict(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, eot_id=EOT)
    out = adaptation_inputs(batch, ["mlm", "match", "cliptc"], gen(), **kw)
    assert set(out) == {"bert_ids", "bert_mask", "clip_ids", "mlm_labels", "match_labels", "cliptc_labels"}
    # CLIPTC targets are drawn on the CLIP text actually fed (after the MATCH swap).
    target = out["cliptc_labels"] != -100
    assert torch.equal(out["cliptc_labels"][target], out["clip_ids"][target])
    again = adaptation_inputs(batch, ["mlm", "match", "cliptc"], gen(), **kw)
    assert all(torch.equal(out[k], again[k]) for k in out)
    mlm_only = adaptation_inputs(batch, ["mlm"], gen(), **kw)
    assert set(mlm_only) == {"bert_ids", "bert_mask", "clip_ids", "mlm_labels"}
    assert torch.equal(mlm_only["clip_ids"], clip)


def test_mlm_negatives_false_drops_targets_only_in_negative_windows():
    ids, mask = bert_batch(batch=64, length=32)
    batch = {"bert_ids": ids, "bert_mask": mask, "clip_ids": clip_batch(batch=64, n_blocks=1)}
    kw = dict(vocab_size=VOCAB, special_ids=SPECIAL, mask_id=MASK, eot_id=EOT)
    everywhere = adaptation_inputs(batch, ["mlm", "match"], gen(), **kw)
    own_only = adaptation_inputs(batch, ["mlm", "match"], gen(), mlm_negatives=False, **kw)
    own = own_only["match_labels"].bool()
    assert 0 < int(own.sum()) < 64  # both kinds of window are in the batch
    # The same draws: inputs and MATCH labels are unchanged, only the negatives' MLM targets go.
    for key in ("bert_ids", "clip_ids", "match_labels"):
        assert torch.equal(everywhere[key], own_only[key])
    assert torch.equal(own_only["mlm_labels"][own], everywhere["mlm_labels"][own])
    assert (everywhere["mlm_labels"][~own] != -100).any()
    assert (own_only["mlm_labels"][~own] == -100).all()
    # Without MATCH every window sees its own text, so the option changes nothing.
    mlm_only = adaptation_inputs(batch, ["mlm"], gen(), mlm_negatives=False, **kw)
    assert torch.equal(mlm_only["mlm_labels"], adaptation_inputs(batch, ["mlm"], gen(), **kw)["mlm_labels"])
