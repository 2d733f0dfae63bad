"""The text tower of an open_clip CLIP ("CLIP-T"), fed several 77-token CLIP blocks per window.

CLIP's causal mask is kept inside the tower. Because of it a real token never attends to the zero
padding after [EOT], so the tower needs no padding mask; padding is masked in the cross layers.

`ClipLayout` says which of a batch's CLIP blocks and positions hold tokens. Found from tensors on a GPU,
each of its numbers is a wait for the GPU; the adaptation batches find it on the host instead
(`modeling.locate`), so the model's forward never reads the GPU's data.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F
from torch import nn

from xdbert.clip import check_name, pinned_clip_weights, register_configs
from xdbert.errors import PipelineError
from xdbert.hub import hub_request, quiet_loading


def clip_uses_quick_gelu(name: str, pretrained: str = "") -> bool:
    """Whether open_clip model `name` with weights `pretrained` needs QuickGELU (the tag decides if it says)."""
    register_configs()
    tag_cfg = open_clip.get_pretrained_cfg(name, pretrained) if pretrained else {}
    model_cfg = open_clip.get_model_config(name) or {}
    return bool(tag_cfg.get("quick_gelu", model_cfg.get("quick_gelu", False)))


@dataclass(frozen=True)
class ClipLayout:
    """Which CLIP blocks and positions of a batch hold tokens, so that the rest are not computed.

    rows: (R,) the blocks to run among the batch's `batch * n_blocks`, in order; length: positions run
    per block (0 when no block is used); kept: (K,) the positions of the `n_blocks * context` that the
    cross layers keep, or None for all of them. Exact (`of(mask)`): the used blocks, up to the longest
    one's [EOT], and the positions that hold a token in some window (None also when none do).
    """

    rows: torch.Tensor
    length: int
    kept: torch.Tensor | None

    @classmethod
    def of(cls, mask: torch.Tensor, multiple: int = 1) -> "ClipLayout":
        """The layout of a (B, n_blocks, context) `clip_block_mask`; reads it on the host.

        `multiple` > 1 trades a little work for few distinct shapes, so that a step recorded as a CUDA
        graph (xdbert.finetuning.compute.graphed) serves most batches: every block of each block position some
        window uses is run, the length is rounded up to `multiple` (at most `context`), and the kept
        positions are those blocks' first `length`. What this adds holds no token: its features are
        zero and it is masked as a key, so the outputs are the same up to rounding.
        """
        batch, n_blocks, context = mask.shape
        lengths = mask.reshape(batch * n_blocks, context).sum(dim=-1)
        if multiple > 1 and bool(lengths.any()):
            columns = mask.any(dim=2).any(dim=0).nonzero().squeeze(1)
            length = min(-(-int(lengths.max()) // multiple) * multiple, context)
            rows = (torch.arange(batch)[:, None] * n_blocks + columns).reshape(-1)
            kept = (columns[:, None] * context + torch.arange(length)).reshape(-1)
            return cls(rows, length, kept if len(kept) < n_blocks * context else None)
        used = mask.reshape(batch, n_blocks * context).any(dim=0)
        kept = used.nonzero().squeeze(1) if bool(used.any()) and not bool(used.all()) else None
        return cls((lengths > 0).nonzero().squeeze(1), int(lengths.max()) if lengths.numel() else 0, kept)

    @property
    def shape(self) -> tuple:
        """What decides the shapes a batch with this layout computes (with the batch's own tensors')."""
        return (len(self.rows), self.length, None if self.kept is None else len(self.kept))

    def copy_(self, other: "ClipLayout", non_blocking: bool = False) -> "ClipLayout":
        """`other`'s blocks and positions written into this layout's tensors, of the same `shape`."""
        self.rows.copy_(other.rows, non_blocking=non_blocking)
        if self.kept is not None:
            self.kept.copy_(other.kept, non_blocking=non_blocking)
        return self

    def clone(self) -> "ClipLayout":
        return self._map(torch.Tensor.clone)

    def pin_memory(self) -> "ClipLayout":
        return self._map(torch.Tensor.pin_memory)

    def to(self, device, non_blocking: bool = False) -> "ClipLayout":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def _map(self, fn) -> "ClipLayout":
        return ClipLayout(fn(self.rows), self.length, None if self.kept is None else fn(self.kept))


_MINIMAL_VISION_CFG = {"image_size": 32, "patch_size": 16, "width": 32, "head_width": 32, "layers": 1}


class CLIPTextTower(nn.Module):
    """The text tower of an open_clip CLIP ("CLIP-T"), fed several 77-token blocks per window.

    Keeps exactly the text parts of the CLIP model: token_embedding, positional_embedding, transformer,
    ln_final, text_projection, logit_scale and the causal attn_mask (a buffer). `forward` returns token
    features after ln_final, (B, n_blocks * context, width), zero at positions that hold no token.
    """

    def __init__(self, clip_model: nn.Module):
        super().__init__()
        text = getattr(clip_model, "text", clip_model)  # CustomTextCLIP keeps the tower in `.text`
        parts = ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection", "attn_mask")
        missing = [p for p in parts if not hasattr(text, p)]
        if missing or getattr(text, "cls_emb", None) is not None:
            raise PipelineError(f"{type(clip_model).__name__} has no plain CLIP text transformer (missing {missing}); use a CLIP model such as ViT-B-32")
        if text.attn_mask is None:
            raise PipelineError("this CLIP text tower has no causal mask; XDBERT needs one (padding is only masked in the cross layers)")
        self.token_embedding = text.token_embedding
        self.positional_embedding = text.positional_embedding
        self.transformer = text.transformer
        self.ln_final = text.ln_final
        self.text_projection = text.text_projection
        self.logit_scale = clip_model.logit_scale
        self.register_buffer("attn_mask", text.attn_mask.clone(), persistent=False)
        # Only the pooled [EOT] feature is projected and scored in CLIP; no XDBERT loss reaches these.
        for p in self.unused_parameters():
            p.requires_grad_(False)

    @classmethod
    def build(cls, name: str, pretrained: str = "", quick_gelu: bool | None = None) -> "CLIPTextTower":
        """Build the tower of open_clip model `name`, with weights `pretrained` (a tag or file; "" = random).

        `quick_gelu=None` follows the pretrained tag (OpenAI's weights were trained with QuickGELU, and
        `ViT-B-32` + `openai` would otherwise build plain GELU under them).
        """
        tower, _ = cls._build(name, pretrained, quick_gelu)
        return tower

    @classmethod
    def _build(cls, name: str, pretrained: str, quick_gelu: bool | None) -> tuple["CLIPTextTower", bool]:
        check_name(name)
        register_configs()
        if pretrained:
            tags = open_clip.list_pretrained_tags_by_model(name)
            if pretrained not in tags and not Path(pretrained).is_file():
                raise PipelineError(f"unknown `model.clip_pretrained: {pretrained}` for {name}; allowed: {', '.join(tags) or 'a checkpoint file'}, or empty for random weights")
        if quick_gelu is None:
            quick_gelu = clip_uses_quick_gelu(name, pretrained)
        device = torch.get_default_device()  # lets callers build on the meta device to count parameters
        # The image tower is dropped at once. Without a checkpoint to load strictly, a minimal one is
        # built instead of the configured one (ViT-B-32's is 88M parameters of wasted time and memory).
        overrides = {} if pretrained else {"vision_cfg": dict(_MINIMAL_VISION_CFG)}
        with hub_request(f"CLIP `{name}` weights `{pretrained}`"), quiet_loading():
            model = open_clip.create_model(
                name, pretrained=pinned_clip_weights(name, pretrained) or None, device=device, force_quick_gelu=quick_gelu,
                require_pretrained=bool(pretrained), **overrides,
            )
        return cls(model), quick_gelu

    def unused_parameters(self) -> list[nn.Parameter]:
        params = [self.logit_scale]
        if isinstance(self.text_projection, nn.Parameter):
            params.append(self.text_projection)
        elif isinstance(self.text_projection, nn.Module):
            params.extend(self.text_projection.parameters())
        return params

    @property
    def width(self) -> int:
        return self.token_embedding.weight.shape[1]

    @property
    def context_length(self) -> int:
        return self.positional_embedding.shape[0]

    def forward(self, clip_ids: torch.Tensor, mask: torch.Tensor, layout: ClipLayout | None = None) -> torch.Tensor:
        """clip_ids, mask: (B, n_blocks, context) -> token features (B, n_blocks * context, width).

        `layout` (`ClipLayout.of(mask)`, found here when not given) names the blocks to run.
        """
        batch, n_blocks, context = clip_ids.shape
        if layout is None:
            layout = ClipLayout.of(mask)
        # All used blocks run as one batch; unused blocks are skipped and blocks are cut after the longest
        # one's [EOT]. With the causal mask a position only sees earlier ones, so the cut changes nothing.
        n, rows = layout.length, layout.rows
        if n == 0:
            return self.token_embedding.weight.new_zeros(batch, n_blocks * context, self.width)
        ids = clip_ids.reshape(batch * n_blocks, context).index_select(0, rows)[:, :n]
        valid = mask.reshape(batch * n_blocks, context).index_select(0, rows)[:, :n]
        x = self.token_embedding(ids) + self.positional_embedding[:n]
        x = self.transformer(x, attn_mask=self.attn_mask[:n, :n])
        # Zero after [EOT] too, so a window's features never depend on what else is in the batch.
        x = F.pad(self.ln_final(x) * valid[..., None].to(x.dtype), (0, 0, 0, context - n))
        out = x.new_zeros(batch * n_blocks, context, x.shape[-1]).index_copy(0, rows, x)
        return out.reshape(batch, n_blocks * context, x.shape[-1])
