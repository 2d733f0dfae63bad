"""The new modules of XDBERT: LXMERT-style cross-modal layers and the pretraining heads.

- `CrossModalLayer` is LXMERT's `LXRTXLayer` for two streams of different widths, built from
  `AttentionSublayer` (attention, projection, residual, post-LayerNorm) and `FeedForward`. Both FFNs use
  the encoder's `intermediate_size` (4H for BERT/ELECTRA), the CLIP stream's one as 512 -> 4H -> 512,
  which is the layout that reproduces Table 6.
- `MaskedTokenHead` serves MLM and CLIPTC (a decoder tied to an embedding); `MatchHead` serves MATCH.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN



class MultiHeadAttention(nn.Module):
    """Attention whose queries (width `width`) and keys/values (width `context_width`) may differ in width.

    The linear maps bring keys and values to the query stream's width (paper, Appendix B). Runs SDPA;
    with `output_attentions` it computes the same attention explicitly to return the probabilities.
    """

    def __init__(self, width: int, context_width: int, heads: int, dropout: float):
        super().__init__()
        if width % heads:
            raise ValueError(f"attention width {width} is not divisible by {heads} heads; choose a head count that divides it")
        self.heads = heads
        self.head_dim = width // heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(context_width, width)
        self.value = nn.Linear(context_width, width)
        self.dropout = dropout

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, context: torch.Tensor, context_mask: torch.Tensor, output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Lq, width) attends to context (B, Lk, context_width) where context_mask (B, Lk) is True."""
        q, k, v = self._split(self.query(x)), self._split(self.key(context)), self._split(self.value(context))
        keep = context_mask[:, None, None, :].bool()  # broadcast over heads and queries
        dropout = self.dropout if self.training else 0.0
        probs = None
        if output_attentions:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            probs = scores.masked_fill(~keep, torch.finfo(scores.dtype).min).softmax(dim=-1)
            out = F.dropout(probs, p=dropout, training=self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout)
        batch, _, length, _ = out.shape
        return out.transpose(1, 2).reshape(batch, length, -1), probs


class AttentionSublayer(nn.Module):
    """Attention, output projection, dropout, residual and post-LayerNorm (BERT's attention block)."""

    def __init__(self, width: int, context_width: int, heads: int, attention_dropout: float, dropout: float, eps: float):
        super().__init__()
        self.attention = MultiHeadAttention(width, context_width, heads, attention_dropout)
        self.output = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(width, eps=eps)

    def forward(self, x, context, context_mask, output_attentions=False):
        attended, probs = self.attention(x, context, context_mask, output_attentions)
        return self.layer_norm(x + self.dropout(self.output(attended))), probs


class FeedForward(nn.Module):
    """width -> intermediate -> width, dropout, residual and post-LayerNorm."""

    def __init__(self, width: int, intermediate: int, act: str, dropout: float, eps: float):
        super().__init__()
        self.dense_in = nn.Linear(width, intermediate)
        self.act = ACT2FN[act]
        self.dense_out = nn.Linear(intermediate, width)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(width, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x + self.dropout(self.dense_out(self.act(self.dense_in(x)))))


class CrossModalLayer(nn.Module):
    """LXMERT's cross-modality layer for a language stream (width H) and a CLIP stream (width W).

    Each stream: cross-attention (queries from itself, keys/values from the other stream's layer input)
    -> self-attention -> feed-forward. Both directions read the layer's inputs, as in `LXRTXLayer`.
    """

    def __init__(self, language_width: int, clip_width: int, language_heads: int, clip_heads: int,
                 intermediate: int, act: str = "gelu", attention_dropout: float = 0.1, dropout: float = 0.1,
                 eps: float = 1e-12):
        super().__init__()
        H, W = language_width, clip_width
        self.language_cross = AttentionSublayer(H, W, language_heads, attention_dropout, dropout, eps)
        self.clip_cross = AttentionSublayer(W, H, clip_heads, attention_dropout, dropout, eps)
        self.language_self = AttentionSublayer(H, H, language_heads, attention_dropout, dropout, eps)
        self.clip_self = AttentionSublayer(W, W, clip_heads, attention_dropout, dropout, eps)
        self.language_ffn = FeedForward(H, intermediate, act, dropout, eps)
        self.clip_ffn = FeedForward(W, intermediate, act, dropout, eps)

    def forward(self, language, language_mask, clip, clip_mask, output_attentions=False, language_cls_only=False,
                clip_output=True):
        """Returns (language, clip, cross attention probabilities or None).

        `language_cls_only` (a last layer whose reader takes only the language [CLS]): returns the
        language [CLS] alone, (B, 1, H), and no CLIP stream. The same numbers at [CLS]; what only the
        other positions or the CLIP stream would read is not computed.
        `clip_output=False` (a last layer whose CLIP stream nothing reads): the language stream alone,
        and no CLIP stream.
        """
        language_x, language_probs = self.language_cross(language, clip, clip_mask, output_attentions)
        if language_cls_only:
            # [CLS] attends to every position of language_x, so the cross-attention above runs in full.
            cls, _ = self.language_self(language_x[:, :1], language_x, language_mask)
            return self.language_ffn(cls), None, None
        if not clip_output and not output_attentions:
            language_x, _ = self.language_self(language_x, language_x, language_mask)
            return self.language_ffn(language_x), None, None
        clip_x, clip_probs = self.clip_cross(clip, language, language_mask, output_attentions)
        language_x, _ = self.language_self(language_x, language_x, language_mask)
        clip_x, _ = self.clip_self(clip_x, clip_x, clip_mask)
        language_x, clip_x = self.language_ffn(language_x), self.clip_ffn(clip_x)
        attentions = {"language": language_probs, "clip": clip_probs} if output_attentions else None
        return language_x, clip_x, attentions


# ----------------------------------------------------------------------------------------------------
# Pretraining heads
# ----------------------------------------------------------------------------------------------------

class MaskedTokenHead(nn.Module):
    """Predict vocabulary ids from hidden states: dense -> act -> LayerNorm -> decoder tied to an embedding.

    The MLM head (tied to the encoder's word embeddings) and the CLIPTC head (tied to CLIP's
    token_embedding) are both this class. It is called on the gathered target rows only, (n, width).
    """

    def __init__(self, width: int, embedding: nn.Embedding, act: str = "gelu", eps: float = 1e-12):
        super().__init__()
        vocab, dim = embedding.weight.shape
        self.dense = nn.Linear(width, dim)
        self.act = ACT2FN[act]
        self.layer_norm = nn.LayerNorm(dim, eps=eps)
        self.decoder = nn.Linear(dim, vocab, bias=False)
        self.decoder.weight = embedding.weight  # tied: the same Parameter
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, hidden: torch.Tensor, classes: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary, (n, vocab), or over the ids `classes` alone, (n, len(classes))."""
        hidden = self.layer_norm(self.act(self.dense(hidden)))
        if classes is None:
            return self.decoder(hidden) + self.bias
        return F.linear(hidden, self.decoder.weight[classes], self.bias[classes])


class MatchHead(nn.Module):
    """Same-sentence prediction from the language [CLS] after the cross layers: pooler (tanh) + 2 classes."""

    def __init__(self, width: int):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.classifier = nn.Linear(width, 2)

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.dense(cls_hidden)))
