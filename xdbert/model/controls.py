"""The mechanism study's encoder-side controls (rung T, ../shared/MECHANISM.md): losses that pull the language
encoder towards CLIP's text tower without any cross layer, so that nothing else reaches the encoder from CLIP.
`XDBertModel.forward` computes them where `distill` or `kl` is among its losses; neither is a paper loss.

- `distill`: a linear map of the encoder's state of each target token, pulled by 1 - cosine towards the tower's
  state at the token's aligned CLIP position (`xdbert.adaptation.masking.distill_targets`).
- `kl`: at a masked token t+1, the MLM head's distribution pulled (KL) towards the tower's next-token
  distribution at token t, both over the words that are one token in each vocabulary (`XDBertModel.restrict_kl`).
  The tower reads the whole text, the encoder a [MASK]: the encoder cannot copy its input, it can only learn
  what the tower expects there (`xdbert.adaptation.masking.kl_targets`).

In both the tower's side is a target, detached. Each function returns the sum over the targets; the model
divides by their count (at least one: no targets give 0 with zero gradients, where a mean of nothing is NaN).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xdbert.clip import clip_block_mask


def tower_states(tower: nn.Module, eot_id: int, clip: torch.Tensor | None, clip_ids: torch.Tensor, layout) -> torch.Tensor:
    """The tower's states (B, n_blocks*context, W) for a control's targets: the forward's CLIP stream `clip` where
    it has one, else (no cross layers) the tower run here on `clip_ids`, without a graph: targets only."""
    if clip is not None:
        return clip
    with torch.no_grad():
        return tower(clip_ids, clip_block_mask(clip_ids, eot_id), layout)


def restrict_kl(model: nn.Module, encoder_ids: torch.Tensor, clip_ids: torch.Tensor) -> nn.Module:
    """Set the words `kl` compares the two distributions over on `model` (an `XDBertModel`): the i-th word is
    `encoder_ids[i]` in the encoder's vocabulary and `clip_ids[i]` in CLIP's
    (`xdbert.data.tokenization.word_ids.shared_single_ids`)."""
    if "kl" not in model.losses:
        raise ValueError(f"this model has no kl loss (losses {list(model.losses)})")
    if encoder_ids.shape != clip_ids.shape or encoder_ids.ndim != 1 or len(encoder_ids) < 2:
        raise ValueError(f"kl needs two id lists of one length >= 2; got {tuple(encoder_ids.shape)} and {tuple(clip_ids.shape)}")
    device = model.mlm_head.bias.device
    model.kl_encoder_ids, model.kl_clip_ids = encoder_ids.long().to(device), clip_ids.long().to(device)
    return model


def aligned_rows(language: torch.Tensor, clip: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the encoder's rows at the targets (n, H), the tower's detached rows at their labels (n, W)): `language`
    (B, L, H), `clip` (B, n_blocks*context, W) with every position kept, `labels` (B, L) flat CLIP positions,
    `positions` the flat indices of the targets in `labels`."""
    rows = language.reshape(-1, language.shape[-1]).index_select(0, positions)
    # each target's row among the batch's CLIP states: its window's first row plus its label
    clip_rows = (positions // labels.shape[1]) * clip.shape[1] + labels.reshape(-1).index_select(0, positions)
    return rows, clip.detach().reshape(-1, clip.shape[-1]).index_select(0, clip_rows)


def distill_distance(distill_map: nn.Module, language: torch.Tensor, clip: torch.Tensor, labels: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """The summed 1 - cosine between each target's mapped encoder state (before the cross layers) and the tower's
    state at its label; it trains the encoder and the map alone."""
    rows, targets = aligned_rows(language, clip, labels, positions)
    return (1 - F.cosine_similarity(distill_map(rows).float(), targets.float(), dim=-1)).sum()


def kl_divergence(mlm_head: nn.Module, encoder_ids: torch.Tensor, token_embedding: torch.Tensor,
                  clip_ids: torch.Tensor, language: torch.Tensor, clip: torch.Tensor, labels: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
    """The summed KL(tower || encoder) over the shared words (`encoder_ids` and `clip_ids`, one word each): the
    tower's states at the labels decoded by its token embedding (the causal language model the `pretrain_clip`
    stage trained), against the MLM head's distribution at the masked token."""
    rows, states = aligned_rows(language, clip, labels, positions)
    tower = (states @ token_embedding.detach()[clip_ids].T).float().log_softmax(-1)
    encoder = mlm_head(rows, encoder_ids).float().log_softmax(-1)
    return F.kl_div(encoder, tower, log_target=True, reduction="sum")
