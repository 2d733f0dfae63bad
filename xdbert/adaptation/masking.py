"""Targets of the adaptation losses, drawn per batch: MLM masking, MATCH negatives, CLIPTC targets, and
the distill control's aligned CLIP positions (drawn from nothing: no random number).

All functions are pure tensor operations (no Python loop over tokens or windows) and deterministic
given a `torch.Generator`. Random numbers are drawn on the generator's device and moved to the ids'
device, so the same generator gives the same batch on CPU and GPU.

Order for one adaptation batch (see `adaptation_inputs`): MATCH negatives first, then CLIPTC targets
on the CLIP text actually fed to the model, then MLM masking of the BERT side (CLIP is never masked),
then the distill and kl targets, which read the MATCH labels and the MLM targets.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

from xdbert.clip import clip_block_mask
from xdbert.model import IGNORE_INDEX


def _rand(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=generator, device=generator.device).to(device)


def choose_exact(eligible: torch.Tensor, prob: float, generator: torch.Generator) -> torch.Tensor:
    """Pick round(prob * n) of the n eligible positions of each row uniformly (at least 1 if n > 0 and prob > 0).

    Like BERT's `create_pretraining_data` (a fixed share per sequence) rather than a coin per token, so
    no window goes without targets. eligible: (N, L) bool -> chosen (N, L) bool.
    """
    scores = _rand(eligible.shape, generator, eligible.device).masked_fill(~eligible, 2.0)  # ineligible last
    n = eligible.sum(dim=-1)
    k = torch.round(n.double() * prob).long()
    if prob > 0:
        k = torch.minimum(k.clamp(min=1), n)
    order = scores.argsort(dim=-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(eligible.shape[-1], device=eligible.device).expand_as(order))
    return rank < k.unsqueeze(-1)


def mask_for_mlm(bert_ids: torch.Tensor, bert_mask: torch.Tensor, *, vocab_size: int, special_ids: Iterable[int],
                 mask_id: int, generator: torch.Generator, prob: float = 0.15,
                 focus_ids: Sequence[int] = (), focus_prob: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: 15% of the real, non-special tokens become targets; of those 80% -> [MASK],
    10% -> a random non-special token, 10% unchanged. Returns (inputs, labels with -100 off target).

    With `focus_prob` > 0, each token of `focus_ids` is a target with that chance instead, and `prob` is the
    share of the other tokens (the mechanism study's upper reference sees its attribute words masked more
    often: issue 68). With none, no extra number is drawn: the batches are those of plain BERT masking.
    """
    special = torch.as_tensor(sorted(set(special_ids)), dtype=bert_ids.dtype, device=bert_ids.device)
    eligible = bert_mask.bool() & ~torch.isin(bert_ids, special)
    focus = None
    if focus_prob > 0 and len(focus_ids):
        focus = eligible & torch.isin(bert_ids, torch.as_tensor(list(focus_ids), dtype=bert_ids.dtype, device=bert_ids.device))
    chosen = choose_exact(eligible if focus is None else eligible & ~focus, prob, generator)
    if focus is not None:
        chosen |= focus & (_rand(bert_ids.shape, generator, bert_ids.device) < focus_prob)
    labels = torch.where(chosen, bert_ids, torch.full_like(bert_ids, IGNORE_INDEX))
    u = _rand(bert_ids.shape, generator, bert_ids.device)
    allowed = torch.arange(vocab_size, device=bert_ids.device)
    allowed = allowed[~torch.isin(allowed, special)]
    pick = torch.randint(len(allowed), tuple(bert_ids.shape), generator=generator, device=generator.device).to(bert_ids.device)
    inputs = torch.where(chosen & (u < 0.8), torch.full_like(bert_ids, mask_id), bert_ids)
    inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), allowed[pick].to(bert_ids.dtype), inputs)
    return inputs, labels


def choose_match_negatives(clip_ids: torch.Tensor, generator: torch.Generator, prob: float = 0.5
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """With probability `prob` give a window the CLIP text of another window of the batch (never its own).

    Returns (clip_ids, match_labels) with label 1 = CLIP sees the same text as BERT. A batch of one
    window has no other window, so it gets no negative. A partner whose CLIP ids happen to be
    identical (a duplicated window) is labelled 1, since the texts are the same.
    """
    batch = clip_ids.shape[0]
    own = torch.arange(batch, device=clip_ids.device)
    if batch < 2:
        return clip_ids.clone(), torch.ones(batch, dtype=torch.long, device=clip_ids.device)
    negative = _rand((batch,), generator, clip_ids.device) < prob
    # A shift in 1..batch-1 reaches every other window with equal chance and never the window itself.
    shift = torch.randint(1, batch, (batch,), generator=generator, device=generator.device).to(clip_ids.device)
    source = torch.where(negative, (own + shift) % batch, own)
    shuffled = clip_ids[source]
    same = (shuffled == clip_ids).flatten(1).all(dim=-1)
    return shuffled, same.long()


def cliptc_targets(clip_ids: torch.Tensor, mask: torch.Tensor, generator: torch.Generator, prob: float = 0.15
                   ) -> torch.Tensor:
    """CLIPTC targets: 15% of each window's real content CLIP tokens; the input is not changed.

    `mask` (from `clip_block_mask`) marks [SOT] content [EOT] of used blocks; [SOT] is a block's first
    valid position and [EOT] its last, so neither, nor padding, is ever a target. Returns labels shaped
    like clip_ids, -100 off target.
    """
    mask = mask.bool()
    first = torch.zeros_like(mask)
    first[..., 0] = True
    last = mask & ~torch.cat([mask[..., 1:], torch.zeros_like(mask[..., :1])], dim=-1)
    content = mask & ~first & ~last
    batch = clip_ids.shape[0]
    chosen = choose_exact(content.reshape(batch, -1), prob, generator).reshape(clip_ids.shape)
    return torch.where(chosen, clip_ids, torch.full_like(clip_ids, IGNORE_INDEX))


def distill_targets(align_start: torch.Tensor, align_end: torch.Tensor, bert_mask: torch.Tensor,
                    own: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None) -> torch.Tensor:
    """The distill control's targets: for each real BERT token aligned with CLIP tokens, the flat CLIP position
    of the last of them (`align_end - 1`), -100 elsewhere; (B, L) like the ids.

    The last: a causal tower's state there has read the whole of the token's text. Only windows whose CLIP text
    is their own (`own`, MATCH label 1; None: every window), and no MLM target (`mlm_labels`), whose input is
    [MASK] or another word: the encoder is pulled towards CLIP's state of the word it reads.
    """
    aligned = bert_mask.bool() & (align_start >= 0) & (align_end > align_start)
    if own is not None:
        aligned &= own.bool().unsqueeze(1)
    if mlm_labels is not None:
        aligned &= mlm_labels == IGNORE_INDEX
    return torch.where(aligned, align_end.long() - 1, torch.full_like(align_end, IGNORE_INDEX, dtype=torch.long))


def kl_targets(align_start: torch.Tensor, align_end: torch.Tensor, mlm_labels: torch.Tensor,
               shared_ids: Sequence[int], context: int = 77) -> torch.Tensor:
    """kl's targets: at each MLM target j that is a word of the shared vocabulary, the flat CLIP position of
    the last CLIP token of the BERT token before it (whose next-token distribution the tower gives), -100
    elsewhere; (B, L) like the ids. Drawn from nothing: kl's targets are a subset of MLM's.

    Only where the tower's next token is the word itself: its CLIP span is one token that starts right where
    the previous token's ends, in the same block (`context` positions), and the next BERT token does not
    share it (a word's first piece, e.g. "play" of "play ##ing", is not the whole word).
    """
    shared = torch.as_tensor(list(shared_ids), dtype=mlm_labels.dtype, device=mlm_labels.device)
    start, end = align_start.long(), align_end.long()
    prev_end, cur_start, cur_end = end[:, :-1], start[:, 1:], end[:, 1:]
    next_start = torch.cat([start[:, 2:], torch.full_like(start[:, :1], -1)], dim=1)
    labels = mlm_labels[:, 1:]
    ok = (labels != IGNORE_INDEX) & torch.isin(labels, shared)
    ok &= (start[:, :-1] >= 0) & (prev_end > start[:, :-1]) & (cur_start == prev_end) & (cur_end == cur_start + 1)
    ok &= (prev_end - 1) // context == cur_start // context
    ok &= next_start != cur_start
    out = torch.where(ok, prev_end - 1, torch.full_like(prev_end, IGNORE_INDEX))
    return torch.cat([torch.full_like(out[:, :1], IGNORE_INDEX), out], dim=1)


def adaptation_inputs(batch: Mapping[str, torch.Tensor], losses: Iterable[str], generator: torch.Generator, *,
                      vocab_size: int, special_ids: Iterable[int], mask_id: int, eot_id: int,
                      mlm_prob: float = 0.15, match_prob: float = 0.5, cliptc_prob: float = 0.15,
                      mlm_negatives: bool = True, focus_ids: Sequence[int] = (), focus_prob: float = 0.0,
                      kl_ids: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """Keyword arguments for `XDBertModel.forward` from a collated window batch, for the enabled losses.

    `mlm_negatives: False` keeps MLM targets only in windows whose CLIP text is their own (MATCH label 1).
    With targets in the negatives too (LXMERT's choice, the default), copying a word from the CLIP side
    is wrong in half of the windows. On bench/alignment_steps.py's toy data that stops random cross
    layers from ever lining the towers up (neither copying nor MATCH within 6,000 steps); without them
    MATCH passes 0.6 at step 750.

    `distill` and `kl` read the batch's `align_start` and `align_end` (the shards' columns); `kl_ids`: the
    encoder's ids of kl's shared vocabulary.
    """
    losses = set(losses)
    bert_ids, bert_mask, clip_ids = batch["bert_ids"], batch["bert_mask"], batch.get("clip_ids")
    out: dict[str, torch.Tensor] = {"bert_ids": bert_ids, "bert_mask": bert_mask, "clip_ids": clip_ids}
    if "match" in losses:
        out["clip_ids"], out["match_labels"] = choose_match_negatives(clip_ids, generator, match_prob)
    if "cliptc" in losses:
        out["cliptc_labels"] = cliptc_targets(out["clip_ids"], clip_block_mask(out["clip_ids"], eot_id), generator, cliptc_prob)
    if "mlm" in losses:
        out["bert_ids"], out["mlm_labels"] = mask_for_mlm(
            bert_ids, bert_mask, vocab_size=vocab_size, special_ids=special_ids, mask_id=mask_id,
            generator=generator, prob=mlm_prob, focus_ids=focus_ids, focus_prob=focus_prob)
        if not mlm_negatives and "match_labels" in out:
            own = out["match_labels"].bool().unsqueeze(1)
            out["mlm_labels"] = torch.where(own, out["mlm_labels"], torch.full_like(out["mlm_labels"], IGNORE_INDEX))
    if "distill" in losses:
        out["distill_labels"] = distill_targets(batch["align_start"], batch["align_end"], bert_mask,
                                                out.get("match_labels"), out.get("mlm_labels"))
    if "kl" in losses:
        if not len(kl_ids):
            raise ValueError("kl needs the shared vocabulary's encoder ids (`kl_ids`)")
        out["kl_labels"] = kl_targets(batch["align_start"], batch["align_end"], out["mlm_labels"], kl_ids,
                                      clip_ids.shape[-1])
    return out

