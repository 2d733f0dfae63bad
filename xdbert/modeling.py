"""The XDBERT cross-modal model: language encoder + CLIP text tower + LXMERT-style cross-modal layers.

Read top to bottom:

1. `build_language_encoder` - any transformers encoder (BERT, ELECTRA, RoBERTa, ...), pretrained or random.
2. `CLIPTextTower` - the text half of an open_clip CLIP ("CLIP-T"), run block by block.
3. `CrossModalLayer` - LXMERT's `LXRTXLayer` for two streams of different widths.
4. `MaskedTokenHead`, `MatchHead` - the pretraining heads (MLM, CLIPTC share one class; MATCH).
5. `XDBertConfig`, `XDBertModel` - the assembled model, its losses and `encode` for finetuning.
6. `count_parameters`, `save_adapted`, `save_full`, `load_full`.

Parameter layout (paper Table 6). With HF `BertModel` (pooler included) as the language encoder, the
full open_clip text tower (token and position embeddings, transformer, ln_final, `text_projection`
and `logit_scale`) and two cross layers, the counts are exactly the paper's:
109,482,240 + 63,428,097 + 2 x 14,574,336 = 202,059,009 for BERT-base / ViT-B-32. Pretraining heads
are not part of these numbers (`count_parameters(model, "backbone")` leaves them out).

Decisions this file takes (the paper does not say):
- CLIP token features are taken after `ln_final`, WITHOUT `text_projection`: the projection was trained
  only on the pooled end-of-text feature, and Table 4 gives CLIP's width as the transformer's 512.
  `text_projection` and `logit_scale` are kept (a pretrained checkpoint loads, Table 6 counts them) but
  no loss reaches them, so they are frozen; so is the encoder's pooler during adaptation.
- CLIP's causal mask is kept inside the tower. Because of it a real token never attends to the zero
  padding after [EOT], so the tower needs no padding mask; padding is masked in the cross layers.
- Both FFNs of a cross layer use the encoder's `intermediate_size` (4H for BERT/ELECTRA), the CLIP
  stream's one as 512 -> 4H -> 512, which is the layout that reproduces Table 6.
- New modules (cross layers, heads, placeholder) start like BERT's: normal(0, initializer_range).
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN

from xdbert.clip import check_name, clip_block_mask, register_configs
from xdbert.errors import PipelineError
from xdbert.hub import hub_request
from xdbert.io import atomic_path, read_json, write_json

LOSSES = ("mlm", "match", "cliptc")
IGNORE_INDEX = -100  # label of positions without a target, as in transformers and F.cross_entropy
RANDOM_PREFIX = "random:"

CONFIG_FILE = "xdbert_config.json"
ENCODER_CONFIG_DIR = "encoder"
WEIGHTS_FILE = "model.safetensors"

# Where a family's pretrained MLM head lives in its `AutoModelForMaskedLM` checkpoint:
# (transform dense, transform LayerNorm, decoder bias). All are dense -> act -> LayerNorm -> tied decoder,
# the layout of `MaskedTokenHead`. ELECTRA discriminators ship no MLM head; their head starts random.
PRETRAINED_MLM_HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
}


# ----------------------------------------------------------------------------------------------------
# 1. Language encoder
# ----------------------------------------------------------------------------------------------------

def build_language_encoder(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PreTrainedModel:
    """The language encoder ("L"): `random:<model_type>` builds one from a config, anything else loads.

    `random:bert` with no overrides is BERT-base with random weights; `config_overrides` are keyword
    arguments of the transformers config (hidden_size, num_hidden_layers, ...) and `vocab_size` the size
    of the tokenizer the pipeline trained. A hub id or a local `save_pretrained` folder is loaded with
    `AutoModel.from_pretrained` (its own config and vocabulary; overrides and vocab_size are not used);
    an offline machine gets a PipelineError saying what to do.
    """
    if name.startswith(RANDOM_PREFIX):
        return AutoModel.from_config(random_encoder_config(name, config_overrides, vocab_size))
    # A pretrained encoder comes with its own config and vocabulary: overrides and vocab_size are not
    # used (params.yaml says `encoder_config` is only for random:<model_type>).
    try:
        with hub_request(f"language encoder `{name}`"):  # an offline machine: PipelineError with what to do
            return AutoModel.from_pretrained(name)
    except (OSError, ValueError) as e:  # not a network failure: a wrong name or folder
        raise PipelineError(
            f"cannot load language encoder `model.encoder: {name}` ({e}); use a hub id such as "
            f"bert-base-uncased, a local save_pretrained folder, or random:<model_type>"
        ) from e


def random_encoder_config(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PretrainedConfig:
    """The transformers config of `random:<model_type>` with the overrides and the trained vocabulary's size."""
    model_type = name[len(RANDOM_PREFIX):]
    overrides = dict(config_overrides or {})
    if vocab_size is not None:
        overrides["vocab_size"] = int(vocab_size)
    try:
        return AutoConfig.for_model(model_type, **overrides)
    except ValueError as e:
        raise PipelineError(
            f"unknown encoder model type `{model_type}` in `model.encoder: {name}`; use random:<model_type> "
            f"with a transformers encoder type such as bert, electra, roberta"
        ) from e


def build_masked_lm(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PreTrainedModel:
    """A random `random:<model_type>` encoder with its family's MLM head (`AutoModelForMaskedLM`), to pretrain."""
    if not name.startswith(RANDOM_PREFIX):
        raise PipelineError(f"only random:<model_type> encoders are pretrained here; `{name}` is used as downloaded")
    return AutoModelForMaskedLM.from_config(random_encoder_config(name, config_overrides, vocab_size))


def load_pretrained_mlm_head(name: str, head: "MaskedTokenHead") -> bool:
    """Copy the MLM head of checkpoint `name` into `head` when the checkpoint has one; True if it did.

    Starting adaptation (and the MLM-only baseline) from BERT's own MLM head matters: a random head
    sends large random gradients into the encoder during the first steps.
    """
    with hub_request(f"MLM head of `{name}`"):
        keys = PRETRAINED_MLM_HEADS.get(AutoConfig.from_pretrained(name).model_type)
        if keys is None:
            return False
        mlm_model, info = AutoModelForMaskedLM.from_pretrained(name, output_loading_info=True)
    dense, norm, bias = keys
    wanted = [f"{dense}.weight", f"{dense}.bias", f"{norm}.weight", f"{norm}.bias", bias]
    if set(wanted) & set(info.get("missing_keys", [])):
        return False  # e.g. an ELECTRA discriminator: its generator head would be random
    state = mlm_model.state_dict()
    with torch.no_grad():
        head.dense.weight.copy_(state[f"{dense}.weight"])
        head.dense.bias.copy_(state[f"{dense}.bias"])
        head.layer_norm.weight.copy_(state[f"{norm}.weight"])
        head.layer_norm.bias.copy_(state[f"{norm}.bias"])
        head.bias.copy_(state[bias])
    return True


# ----------------------------------------------------------------------------------------------------
# 2. CLIP text tower
# ----------------------------------------------------------------------------------------------------

def clip_uses_quick_gelu(name: str, pretrained: str = "") -> bool:
    """Whether open_clip model `name` with weights `pretrained` needs QuickGELU (the tag decides if it says)."""
    register_configs()
    tag_cfg = open_clip.get_pretrained_cfg(name, pretrained) if pretrained else {}
    model_cfg = open_clip.get_model_config(name) or {}
    return bool(tag_cfg.get("quick_gelu", model_cfg.get("quick_gelu", False)))


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
        with hub_request(f"CLIP `{name}` weights `{pretrained}`"):
            model = open_clip.create_model(
                name, pretrained=pretrained or None, device=device, force_quick_gelu=quick_gelu,
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

    def forward(self, clip_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """clip_ids, mask: (B, n_blocks, context) -> token features (B, n_blocks * context, width)."""
        batch, n_blocks, context = clip_ids.shape
        ids = clip_ids.reshape(batch * n_blocks, context)
        valid = mask.reshape(batch * n_blocks, context)
        lengths = valid.sum(dim=-1)
        used = lengths > 0
        # All blocks run as one batch; unused blocks are skipped and blocks are cut after the longest
        # one's [EOT]. With the causal mask a position only sees earlier ones, so the cut changes nothing.
        n = int(lengths.max()) if bool(used.any()) else 0
        if n == 0:
            return self.token_embedding.weight.new_zeros(batch, n_blocks * context, self.width)
        x = self.token_embedding(ids[used, :n]) + self.positional_embedding[:n]
        x = self.transformer(x, attn_mask=self.attn_mask[:n, :n])
        # Zero after [EOT] too, so a window's features never depend on what else is in the batch.
        x = self.ln_final(x) * valid[used, :n, None].to(x.dtype)
        out = x.new_zeros(batch * n_blocks, context, x.shape[-1])
        out[used, :n] = x
        return out.reshape(batch, n_blocks * context, x.shape[-1])


# ----------------------------------------------------------------------------------------------------
# 3. Cross-modal layer
# ----------------------------------------------------------------------------------------------------

class MultiHeadAttention(nn.Module):
    """Attention whose queries (width `width`) and keys/values (width `context_width`) may differ in width.

    The linear maps bring keys and values to the query stream's width (paper, Appendix B). Runs SDPA;
    with `output_attentions` it computes the same attention explicitly to return the probabilities.
    """

    def __init__(self, width: int, context_width: int, heads: int, dropout: float):
        super().__init__()
        if width % heads:
            raise PipelineError(f"attention width {width} is not divisible by {heads} heads; choose a head count that divides it")
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

    def forward(self, language, language_mask, clip, clip_mask, output_attentions=False, language_cls_only=False):
        """Returns (language, clip, cross attention probabilities or None).

        `language_cls_only` (a last layer whose reader takes only the language [CLS]): returns the
        language [CLS] alone, (B, 1, H), and no CLIP stream. The same numbers at [CLS]; what only the
        other positions or the CLIP stream would read is not computed.
        """
        language_x, language_probs = self.language_cross(language, clip, clip_mask, output_attentions)
        if language_cls_only:
            # [CLS] attends to every position of language_x, so the cross-attention above runs in full.
            cls, _ = self.language_self(language_x[:, :1], language_x, language_mask)
            return self.language_ffn(cls), None, None
        clip_x, clip_probs = self.clip_cross(clip, language, language_mask, output_attentions)
        language_x, _ = self.language_self(language_x, language_x, language_mask)
        clip_x, _ = self.clip_self(clip_x, clip_x, clip_mask)
        language_x, clip_x = self.language_ffn(language_x), self.clip_ffn(clip_x)
        attentions = {"language": language_probs, "clip": clip_probs} if output_attentions else None
        return language_x, clip_x, attentions


# ----------------------------------------------------------------------------------------------------
# 4. Pretraining heads
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


# ----------------------------------------------------------------------------------------------------
# 5. Config and model
# ----------------------------------------------------------------------------------------------------

@dataclass
class XDBertConfig:
    """Everything needed to rebuild an XDBertModel; JSON-serialisable (`to_dict` / `from_dict`)."""

    encoder: str = "random:bert"                 # hub id, local folder, or random:<model_type>
    encoder_config: dict = field(default_factory=dict)  # overrides for random:<model_type>
    vocab_size: int | None = None                # random encoders: the trained WordPiece vocabulary
    clip: str = "xdbert-tiny"                    # open_clip model name
    clip_pretrained: str = ""                    # open_clip tag or file; "" = random weights
    clip_quick_gelu: bool | None = None          # None: as the pretrained tag says; resolved on build
    clip_heads: int = 8                          # heads of the CLIP stream in the cross layers
    clip_blocks: int = 9                         # blocks of 77 per window (placeholder length)
    cross_layers: int = 2
    losses: list = field(default_factory=lambda: list(LOSSES))
    placeholder: bool = False                    # replace CLIP by a learned sequence (control run)
    clip_eot_id: int = 49407                     # CLIP BPE's <|endoftext|>; the CLIP mask is built from it
    init_range: float | None = None              # std of the new modules' normal init; None = the encoder's initializer_range

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "XDBertConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PipelineError(f"unknown XDBERT config keys {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)

    @property
    def uses_clip(self) -> bool:
        """Whether the CLIP stream exists (real tower or placeholder): any cross layer needs one."""
        return self.cross_layers > 0

    def validate(self) -> "XDBertConfig":
        if not isinstance(self.losses, (list, tuple)) or not self.losses or any(l not in LOSSES for l in self.losses) \
                or len(set(self.losses)) != len(self.losses):
            raise PipelineError(f"`losses: {self.losses!r}` must be a non-empty list without repeats drawn from: {', '.join(LOSSES)}")
        if not isinstance(self.cross_layers, int) or self.cross_layers < 0:
            raise PipelineError(f"`cross_layers` must be an integer >= 0; got {self.cross_layers!r}")
        if self.init_range is not None and (not isinstance(self.init_range, (int, float)) or isinstance(self.init_range, bool) or self.init_range <= 0):
            raise PipelineError(f"`init_range` must be a positive number, or null for the encoder's initializer_range; got {self.init_range!r}")
        for key in ("clip_heads", "clip_blocks"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise PipelineError(f"`{key}` must be a positive integer; got {value!r}")
        if self.cross_layers == 0 and (set(self.losses) != {"mlm"} or self.placeholder):
            raise PipelineError(f"`cross_layers: 0` (the MLM-only baseline) allows only `losses: [mlm]` without placeholder; got losses {self.losses}, placeholder {self.placeholder}")
        if self.placeholder and set(self.losses) & {"cliptc", "match"}:
            # CLIPTC has no CLIP tokens to reconstruct; MATCH could only read the CLIP text's length
            # from the mask, which would make the control learn from a leak instead of from CLIP.
            raise PipelineError(f"`placeholder: true` replaces the CLIP text, so losses cliptc and match are impossible; use `losses: [mlm]` (got {self.losses})")
        return self


class XDBertModel(nn.Module):
    """Language encoder + CLIP text tower + cross-modal layers + MLM / MATCH / CLIPTC heads.

    `XDBertModel.build(config)` loads or creates the parts named in the config; the constructor only
    assembles given parts (used by `load_full`, which fills them from a saved state).
    """

    def __init__(self, config: XDBertConfig, encoder: PreTrainedModel, clip: CLIPTextTower | None = None):
        super().__init__()
        self.config = config.validate()
        self.losses = tuple(config.losses)
        self.encoder = encoder
        enc = encoder.config
        width = enc.hidden_size
        act = getattr(enc, "hidden_act", "gelu")
        eps = getattr(enc, "layer_norm_eps", 1e-12)
        std = config.init_range or getattr(enc, "initializer_range", 0.02)
        needs_tower = config.uses_clip and not config.placeholder
        if needs_tower != (clip is not None):
            raise ValueError(f"a CLIP tower is {'needed' if needs_tower else 'not used'} with cross_layers={config.cross_layers}, placeholder={config.placeholder}")
        self.clip = clip
        self.placeholder = None
        clip_width = None
        if clip is not None:
            clip_width, self.context_length = clip.width, clip.context_length
        elif config.placeholder:
            text_cfg = open_clip.get_model_config(check_name(config.clip))["text_cfg"]
            clip_width, self.context_length = text_cfg["width"], text_cfg.get("context_length", 77)
            # Seed 003's "transferred grounding" placeholder, one learned vector per CLIP position.
            self.placeholder = nn.Parameter(torch.empty(config.clip_blocks * self.context_length, clip_width))
            nn.init.normal_(self.placeholder, std=std)
        self.cross_layers = nn.ModuleList(
            CrossModalLayer(width, clip_width, enc.num_attention_heads, config.clip_heads,
                            getattr(enc, "intermediate_size", 4 * width), act,
                            getattr(enc, "attention_probs_dropout_prob", 0.1), getattr(enc, "hidden_dropout_prob", 0.1), eps)
            for _ in range(config.cross_layers)
        )
        self.mlm_head = MaskedTokenHead(width, encoder.get_input_embeddings(), act, eps) if "mlm" in self.losses else None
        self.match_head = MatchHead(width) if "match" in self.losses else None
        self.cliptc_head = MaskedTokenHead(clip_width, clip.token_embedding, "gelu", eps) if "cliptc" in self.losses else None
        for module in (self.cross_layers, self.match_head):
            _init_bert_style(module, std)
        for head in (self.mlm_head, self.cliptc_head):
            if head is not None:  # not the decoder: it is the (pretrained) embedding
                _init_bert_style(head.dense, std)
                _init_bert_style(head.layer_norm, std)
                nn.init.zeros_(head.bias)
        # The pooler is not on any loss path (MATCH has its own); frozen so DDP and optimizers skip it.
        # It is still saved by `save_adapted`, unchanged, for finetuning.
        pooler = getattr(encoder, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.mlm_head_source = "random"
        # CLIPTC's classes when restricted (`restrict_cliptc`); None = all of CLIP's ids. Not saved.
        self.register_buffer("cliptc_classes", None, persistent=False)
        self.register_buffer("cliptc_class_of", None, persistent=False)

    @classmethod
    def build(cls, config: XDBertConfig) -> "XDBertModel":
        """Create the model named by `config`: pretrained parts are loaded (hub or local), random ones built."""
        config = dataclasses.replace(config, losses=list(config.losses), encoder_config=dict(config.encoder_config)).validate()
        pretrained_encoder = not config.encoder.startswith(RANDOM_PREFIX)
        encoder = build_language_encoder(config.encoder, config.encoder_config, config.vocab_size)
        clip = None
        if config.uses_clip and not config.placeholder:
            clip, config.clip_quick_gelu = CLIPTextTower._build(config.clip, config.clip_pretrained, config.clip_quick_gelu)
        model = cls(config, encoder, clip)
        if pretrained_encoder and model.mlm_head is not None and load_pretrained_mlm_head(config.encoder, model.mlm_head):
            model.mlm_head_source = f"pretrained:{config.encoder}"
        return model

    def restrict_cliptc(self, ids: torch.Tensor) -> "XDBertModel":
        """Score CLIPTC over the CLIP ids in `ids` alone instead of all of CLIP's vocabulary.

        The adapt stage passes every id of its token shards (`adapt.cliptc_vocab: shards`), so every
        target is among them; the others can never be a target. On wiki103 that is nearly all of
        CLIP's 49,408 ids and changes little, but the embedded corpus uses 990, and decoding the rest
        was a third of each step of its tiny model.
        """
        if self.cliptc_head is None:
            raise ValueError("this model has no CLIPTC head")
        device = self.cliptc_head.bias.device
        classes = torch.unique(ids.reshape(-1).long()).to(device)
        class_of = torch.full_like(self.cliptc_head.bias, IGNORE_INDEX, dtype=torch.long)
        class_of[classes] = torch.arange(len(classes), device=device)
        self.cliptc_classes, self.cliptc_class_of = classes, class_of
        return self

    def strip_heads(self) -> "XDBertModel":
        """Drop the pretraining heads (finetuning the full model, Table 8, needs only `encode`), so no
        parameter is left that no loss reaches. `forward` then computes no loss."""
        self.mlm_head = self.match_head = self.cliptc_head = None
        return self

    # -- forward ---------------------------------------------------------------------------------

    def _clip_stream(self, clip_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CLIP token features (B, n_blocks*context, W) and their mask (B, n_blocks*context)."""
        batch, n_blocks, context = clip_ids.shape
        if context != self.context_length:
            raise PipelineError(f"CLIP blocks have {context} positions, the CLIP model expects {self.context_length}")
        mask = clip_block_mask(clip_ids, self.config.clip_eot_id)
        if self.placeholder is not None:
            if n_blocks > self.config.clip_blocks:
                raise PipelineError(f"the placeholder covers {self.config.clip_blocks} CLIP blocks, the batch has {n_blocks}; raise `clip_blocks`")
            features = self.placeholder[: n_blocks * context].unsqueeze(0).expand(batch, -1, -1)
        else:
            features = self.clip(clip_ids, mask)
        return features, mask.reshape(batch, n_blocks * context)

    def _encode(self, bert_ids, bert_mask, clip_ids, output_attentions=False, token_type_ids=None, language_cls_only=False):
        """(language, clip, clip_mask, attentions, kept): `kept` indexes the CLIP positions the cross layers
        saw (None: all of them). `language_cls_only`: the last cross layer computes only the language
        [CLS], (B, 1, H), and clip is None (see `CrossModalLayer`)."""
        if language_cls_only and output_attentions:
            raise ValueError("language_cls_only skips the last layer's CLIP stream: it cannot return its attention maps")
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # not every encoder takes them
        language = self.encoder(input_ids=bert_ids, attention_mask=bert_mask, **types).last_hidden_state
        if not self.config.uses_clip:
            return language, None, None, [], None
        if clip_ids is None:
            raise ValueError("this model has cross layers: clip_ids are required")
        clip, clip_mask = self._clip_stream(clip_ids)
        kept = None
        used = clip_mask.any(dim=0)
        if not output_attentions and bool(used.any()) and not bool(used.all()):  # (none used: nothing to gain)
            # Positions that hold no token in any window of the batch are dropped before the cross layers:
            # as keys they are masked and their own states are never read, so only the cost changes. A
            # finetuning sentence fills about 20 of its block's 77 positions, so this is most of the work.
            # Attention maps keep the full layout (the analyses index it by CLIP position).
            kept = used.nonzero().squeeze(1)
            clip, clip_mask = clip[:, kept], clip_mask[:, kept]
        language_mask = bert_mask.bool()
        attentions = []
        last = len(self.cross_layers) - 1
        for i, layer in enumerate(self.cross_layers):
            language, clip, probs = layer(language, language_mask, clip, clip_mask, output_attentions,
                                          language_cls_only and i == last)
            attentions.append(probs)
        return language, clip, clip_mask, attentions, kept

    def encode(self, bert_ids: torch.Tensor, bert_mask: torch.Tensor, clip_ids: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, language_cls_only: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(language hidden states after the cross layers (B, L, H), CLIP stream states (B, n_blocks*77, W)).

        Without cross layers the CLIP states are None and the language states are the encoder's output.
        CLIP positions that hold no token in any window of the batch are zero. Finetuning the full model
        (paper Table 8) classifies from the language [CLS]: `language_cls_only` returns it alone, (B, 1, H),
        and no CLIP states, skipping the last cross layer's work that nothing reads.
        """
        language, clip, _, _, kept = self._encode(bert_ids, bert_mask, clip_ids, token_type_ids=token_type_ids,
                                                  language_cls_only=language_cls_only)
        if kept is not None and clip is not None:
            full = clip.new_zeros(clip.shape[0], clip_ids.shape[1] * clip_ids.shape[2], clip.shape[2])
            full[:, kept] = clip
            clip = full
        return language, clip

    def forward(self, bert_ids: torch.Tensor, bert_mask: torch.Tensor, clip_ids: torch.Tensor | None = None,
                mlm_labels: torch.Tensor | None = None, match_labels: torch.Tensor | None = None,
                cliptc_labels: torch.Tensor | None = None, output_attentions: bool = False) -> dict[str, Any]:
        """Losses of the enabled objectives whose labels are given, and their accuracy counts.

        Returns `loss` (unweighted sum; absent when no labels were given), `<name>_loss`,
        `<name>_count` and `<name>_correct` for each computed objective, and `cross_attentions`
        (per layer {"language": (B, heads, L, C), "clip": (B, clip_heads, C, L)}) if asked.
        Labels of objectives not in `config.losses` are ignored, so one batch format serves all variants.
        """
        language, clip, _, attentions, kept = self._encode(bert_ids, bert_mask, clip_ids, output_attentions)
        out: dict[str, Any] = {}
        total = []
        if self.mlm_head is not None and mlm_labels is not None:
            self._token_loss(out, "mlm", self.mlm_head, language, mlm_labels)
            total.append(out["mlm_loss"])
        if self.match_head is not None and match_labels is not None:
            logits = self.match_head(language[:, 0])
            out["match_loss"] = F.cross_entropy(logits.float(), match_labels)
            out["match_count"] = torch.tensor(match_labels.numel(), device=logits.device)
            out["match_correct"] = (logits.argmax(-1) == match_labels).sum().detach()
            total.append(out["match_loss"])
        if self.cliptc_head is not None and cliptc_labels is not None:
            labels = cliptc_labels.reshape(clip.shape[0], -1)
            if kept is not None:  # targets are real tokens, so none is at a dropped position
                labels = labels[:, kept]
            self._token_loss(out, "cliptc", self.cliptc_head, clip, labels, self.cliptc_classes, self.cliptc_class_of)
            total.append(out["cliptc_loss"])
        if total:
            out["loss"] = torch.stack(total).sum()
        if output_attentions:
            out["cross_attentions"] = attentions
        return out

    @staticmethod
    def _token_loss(out: dict, name: str, head: MaskedTokenHead, hidden: torch.Tensor, labels: torch.Tensor,
                    classes: torch.Tensor | None = None, class_of: torch.Tensor | None = None) -> None:
        """Vocabulary logits only at target positions: gather the rows first, then decode (n, vocab).
        With `classes` (ids, and `class_of` mapping each id to its place), only those ids are scored."""
        targets = labels != IGNORE_INDEX
        rows, wanted = hidden[targets], labels[targets]
        if classes is not None:
            wanted = class_of[wanted]
        if wanted.numel() == 0:
            out[f"{name}_loss"] = hidden.sum() * 0.0  # keeps the graph; cross_entropy of nothing is NaN
            out[f"{name}_count"] = torch.tensor(0, device=hidden.device)
            out[f"{name}_correct"] = torch.tensor(0, device=hidden.device)
            return
        logits = head(rows, classes)
        out[f"{name}_loss"] = F.cross_entropy(logits.float(), wanted)
        out[f"{name}_count"] = torch.tensor(wanted.numel(), device=hidden.device)
        out[f"{name}_correct"] = (logits.argmax(-1) == wanted).sum().detach()


def _init_bert_style(module: nn.Module | None, std: float) -> None:
    if module is None:
        return
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# ----------------------------------------------------------------------------------------------------
# 6. Counting and saving
# ----------------------------------------------------------------------------------------------------

PARTS = ("encoder", "clip", "cross", "heads", "backbone", "all")


def count_parameters(model: XDBertModel, part: str = "backbone") -> int:
    """Parameters of one part, each shared tensor once.

    encoder: the language encoder (Table 6 "BERT-b"); clip: CLIP tower or placeholder; cross: the cross
    layers; backbone: encoder + clip + cross (Table 6 "XBERT-b", the full model without heads);
    heads: what the pretraining heads add (tied decoders excluded); all: everything.
    """
    def unique(modules) -> dict[int, nn.Parameter]:
        params = {}
        for m in modules:
            if isinstance(m, nn.Parameter):
                params[id(m)] = m
            elif m is not None:
                params.update({id(p): p for p in m.parameters()})
        return params

    encoder = unique([model.encoder])
    clip = unique([model.clip, model.placeholder])
    cross = unique([model.cross_layers])
    backbone = {**encoder, **clip, **cross}
    everything = unique([model])
    heads = {k: v for k, v in everything.items() if k not in backbone}
    parts = {"encoder": encoder, "clip": clip, "cross": cross, "heads": heads, "backbone": backbone, "all": everything}
    if part not in parts:
        raise PipelineError(f"unknown part {part!r}; allowed: {', '.join(PARTS)}")
    return sum(p.numel() for p in parts[part].values())


CLIP_CONFIG_FILE = "clip_config.json"   # a saved CLIP text tower: what it is ...
CLIP_WEIGHTS_FILE = "model.safetensors"  # ... and its weights


def save_clip_tower(tower: nn.Module, directory: str | Path, clip: str, clip_pretrained: str = "",
                    clip_quick_gelu: bool | None = None) -> Path:
    """Write a CLIP text tower (the `pretrained` stage's output, the `clip` finetuning kind's input):
    clip_config.json + model.safetensors.

    `clip_quick_gelu=None` is resolved as the tower was built (from the pretrained tag), so the
    reader rebuilds the same activation before loading the weights.
    """
    from safetensors.torch import save_model

    if clip_quick_gelu is None:
        clip_quick_gelu = clip_uses_quick_gelu(clip, clip_pretrained)
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / CLIP_CONFIG_FILE, {"clip": clip, "clip_pretrained": clip_pretrained, "clip_quick_gelu": clip_quick_gelu})
        save_model(tower, str(tmp / CLIP_WEIGHTS_FILE))
    return Path(directory)


def load_clip_tower(directory: str | Path) -> tuple[CLIPTextTower, dict]:
    """(tower, config) from a folder written by `save_clip_tower`; the weights come from the folder."""
    from safetensors.torch import load_model

    directory = Path(directory)
    if not (directory / CLIP_CONFIG_FILE).is_file():
        raise PipelineError(f"{directory} is not a saved CLIP text tower (no {CLIP_CONFIG_FILE}): run `dvc repro pretrained`")
    config = read_json(directory / CLIP_CONFIG_FILE)
    tower = CLIPTextTower.build(config["clip"], "", config.get("clip_quick_gelu"))
    load_model(tower, str(directory / CLIP_WEIGHTS_FILE), strict=True)
    return tower, config


def save_adapted(model: XDBertModel, directory: str | Path, tokenizer_dir: str | Path) -> Path:
    """Write the adapted language encoder alone (XDBERT) as a `save_pretrained` folder with its tokenizer.

    `AutoModel.from_pretrained(directory)` then gives a plain encoder with the original parameter count.
    """
    tokenizer_dir = Path(tokenizer_dir)
    files = sorted(p for p in tokenizer_dir.iterdir() if p.is_file()) if tokenizer_dir.is_dir() else []
    if not files:
        raise PipelineError(f"tokenizer folder {tokenizer_dir} is missing or empty: run the tokenize stage first (`dvc repro tokenize`)")
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        model.encoder.save_pretrained(tmp)
        for f in files:
            if not (tmp / f.name).exists():  # the encoder's own config.json wins over a tokenizer file of that name
                shutil.copy2(f, tmp / f.name)
    return Path(directory)


def save_full(model: XDBertModel, directory: str | Path) -> Path:
    """Write the whole cross-modal model: config JSON, the encoder's transformers config, safetensors.

    The same weights always give the same bytes, so DVC sees an unchanged model as unchanged. The
    decoders tied to the embeddings are stored once, under the embedding's name, and without
    safetensors' `save_model` metadata: it names the dropped duplicates in a map whose order changes
    from run to run. `load_model` reties them from the model's own structure.
    """
    from safetensors.torch import save_file

    state, stored = {}, set()
    for name, tensor in model.state_dict().items():  # embeddings come before the heads tied to them
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in stored:
            stored.add(key)
            state[name] = tensor.contiguous()
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        model.encoder.config.save_pretrained(tmp / ENCODER_CONFIG_DIR)
        save_file(state, str(tmp / WEIGHTS_FILE))
    return Path(directory)


def load_full(directory: str | Path, device: str | torch.device = "cpu") -> XDBertModel:
    """Rebuild a model written by `save_full`, exactly; nothing is downloaded."""
    from safetensors.torch import load_model

    from xdbert.io import read_json

    directory = Path(directory)
    config = XDBertConfig.from_dict(read_json(directory / CONFIG_FILE))
    encoder = AutoModel.from_config(AutoConfig.from_pretrained(directory / ENCODER_CONFIG_DIR))
    clip = None
    if config.uses_clip and not config.placeholder:
        clip = CLIPTextTower.build(config.clip, "", config.clip_quick_gelu)  # weights come from the file
    model = XDBertModel(config, encoder, clip)
    load_model(model, str(directory / WEIGHTS_FILE), strict=True)  # strict: a missing tensor is an error
    return model.to(device)
