"""The XDBERT cross-modal model: language encoder + CLIP text tower + LXMERT-style cross-modal layers.

Read top to bottom: `XDBertConfig` (everything needed to rebuild a model), `XDBertModel` (its parts, its
losses, and `encode` for finetuning), `clip_path_cut` (a test switch: the language side blind to CLIP),
`count_parameters` (paper Table 6). The parts live beside this module: `encoders`, `clip_tower`, `layers`.

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
- CLIP's causal mask is kept inside the tower, so padding is masked in the cross layers only.
- New modules (cross layers, heads, placeholder) start like BERT's: normal(0, initializer_range).
- `distill` and `kl` (the mechanism study's encoder-side controls, off by default; `controls`): the encoder
  pulled towards the CLIP tower's states or its next-token distribution. With `cross_layers: 0` the model
  holds the tower for their targets alone, frozen.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from xdbert.clip import check_name, clip_block_mask
from xdbert.model import IGNORE_INDEX, LOSSES, PAPER_LOSSES
from xdbert.model import controls
from xdbert.model.clip_tower import CLIPTextTower, ClipLayout
from xdbert.model.encoders import build_language_encoder, load_pretrained_mlm_head
from xdbert.model.layers import CrossModalLayer, MaskedTokenHead, MatchHead
from xdbert.random_encoder import RANDOM_PREFIX


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
    losses: list = field(default_factory=lambda: list(PAPER_LOSSES))
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
            raise ValueError(f"unknown XDBERT config keys {unknown}; known: {', '.join(sorted(known))}")
        return cls(**d)

    @property
    def uses_clip(self) -> bool:
        """Whether the CLIP stream exists (real tower or placeholder): any cross layer needs one."""
        return self.cross_layers > 0

    @property
    def has_tower(self) -> bool:
        """Whether the model holds CLIP's text tower: for a CLIP stream that is not the placeholder, or for the
        targets of `distill` or `kl`."""
        return (self.uses_clip and not self.placeholder) or bool({"distill", "kl"} & set(self.losses))

    def validate(self) -> "XDBertConfig":
        if not isinstance(self.losses, (list, tuple)) or not self.losses or any(l not in LOSSES for l in self.losses) \
                or len(set(self.losses)) != len(self.losses):
            raise ValueError(f"`losses: {self.losses!r}` must be a non-empty list without repeats drawn from: {', '.join(LOSSES)}")
        if not isinstance(self.cross_layers, int) or self.cross_layers < 0:
            raise ValueError(f"`cross_layers` must be an integer >= 0; got {self.cross_layers!r}")
        if self.init_range is not None and (not isinstance(self.init_range, (int, float)) or isinstance(self.init_range, bool) or self.init_range <= 0):
            raise ValueError(f"`init_range` must be a positive number, or null for the encoder's initializer_range; got {self.init_range!r}")
        for key in ("clip_heads", "clip_blocks"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{key}` must be a positive integer; got {value!r}")
        if self.cross_layers == 0 and (set(self.losses) - {"distill", "kl"} != {"mlm"} or self.placeholder):
            raise ValueError(f"`cross_layers: 0` (the MLM-only baseline, or it with an encoder-side control) allows only "
                             f"`losses: [mlm]` with distill or kl besides, without placeholder; got losses {self.losses}, "
                             f"placeholder {self.placeholder}")
        if "kl" in self.losses and ("mlm" not in self.losses or self.placeholder):
            raise ValueError(f"`kl` pulls the MLM head's distribution towards CLIP's tower: it needs `mlm` and no "
                             f"placeholder; got losses {self.losses}, placeholder {self.placeholder}")
        if self.placeholder and set(self.losses) & {"cliptc", "match"}:
            # CLIPTC has no CLIP tokens to reconstruct; MATCH could only read the CLIP text's length
            # from the mask, which would make the control learn from a leak instead of from CLIP.
            raise ValueError(f"`placeholder: true` replaces the CLIP text, so losses cliptc and match are impossible; use `losses: [mlm]` (got {self.losses})")
        if self.placeholder and "distill" in self.losses:
            raise ValueError(f"`placeholder: true` has no CLIP tower whose states distill could target; use `losses: [mlm]` (got {self.losses})")
        return self


class XDBertModel(nn.Module):
    """Language encoder + CLIP text tower + cross-modal layers + MLM / MATCH / CLIPTC heads (+ the distill map).

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
        needs_tower = config.has_tower
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
            # The control run: one learned vector per CLIP position in place of CLIP's features.
            self.placeholder = nn.Parameter(torch.empty(config.clip_blocks * self.context_length, clip_width))
            nn.init.normal_(self.placeholder, std=std, generator=part_generator("placeholder"))
        self.cross_layers = nn.ModuleList(
            CrossModalLayer(width, clip_width, enc.num_attention_heads, config.clip_heads,
                            getattr(enc, "intermediate_size", 4 * width), act,
                            getattr(enc, "attention_probs_dropout_prob", 0.1), getattr(enc, "hidden_dropout_prob", 0.1), eps)
            for _ in range(config.cross_layers)
        )
        self.mlm_head = MaskedTokenHead(width, encoder.get_input_embeddings(), act, eps) if "mlm" in self.losses else None
        self.match_head = MatchHead(width) if "match" in self.losses else None
        self.cliptc_head = MaskedTokenHead(clip_width, clip.token_embedding, "gelu", eps) if "cliptc" in self.losses else None
        _init_bert_style(self.cross_layers, std, part_generator("cross_layers"))
        _init_bert_style(self.match_head, std, part_generator("match_head"))
        if self.cliptc_head is None and config.cross_layers:
            # Without CLIPTC no loss reads the last layer's CLIP stream. Its sublayers stay (Table 6 counts
            # them) but are frozen and not computed in training, so DDP has no parameter without a gradient
            # to wait for, and the optimizer skips what it could never train.
            last = self.cross_layers[-1]
            for part in (last.clip_cross, last.clip_self, last.clip_ffn):
                part.requires_grad_(False)
        for name in ("mlm_head", "cliptc_head"):
            head = getattr(self, name)
            if head is not None:  # not the decoder: it is the (pretrained) embedding
                generator = part_generator(name)
                _init_bert_style(head.dense, std, generator)
                _init_bert_style(head.layer_norm, std, generator)
                nn.init.zeros_(head.bias)
        # Built last, from a generator of its own: the other parts and the global RNG's draws before it are
        # those of a model without it.
        self.distill_map = nn.Linear(width, clip_width) if "distill" in self.losses else None
        _init_bert_style(self.distill_map, std, part_generator("distill_map"))
        if clip is not None and not config.uses_clip:
            # the tower only gives distill or kl their targets: no loss trains it, and an optimizer or DDP need not see it
            clip.requires_grad_(False)
        # The pooler is not on any loss path (MATCH has its own); frozen so DDP and optimizers skip it.
        # It is still saved by `save_adapted`, unchanged, for finetuning.
        pooler = getattr(encoder, "pooler", None)
        if isinstance(pooler, nn.Module):
            pooler.requires_grad_(False)
        self.mlm_head_source = "random"
        # CLIPTC's classes when restricted (`restrict_cliptc`); None = all of CLIP's ids. Not saved.
        self.register_buffer("cliptc_classes", None, persistent=False)
        self.register_buffer("cliptc_class_of", None, persistent=False)
        # kl's shared vocabulary (`controls.restrict_kl`): each word's id in the encoder's and CLIP's vocabulary. Not saved.
        self.register_buffer("kl_encoder_ids", None, persistent=False)
        self.register_buffer("kl_clip_ids", None, persistent=False)

    @classmethod
    def build(cls, config: XDBertConfig, clip: CLIPTextTower | None = None) -> "XDBertModel":
        """Create the model named by `config`: pretrained parts are loaded (hub or local), random ones built.
        `clip`: a tower loaded already (the `pretrain_clip` stage's), taken instead of building one; then
        `config.clip_quick_gelu` says how it was built."""
        config = dataclasses.replace(config, losses=list(config.losses), encoder_config=dict(config.encoder_config)).validate()
        pretrained_encoder = not config.encoder.startswith(RANDOM_PREFIX)
        encoder = build_language_encoder(config.encoder, config.encoder_config, config.vocab_size)
        if clip is None and config.has_tower:
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
        is a third of each step of its tiny model.
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
        self.mlm_head = self.match_head = self.cliptc_head = self.distill_map = None
        return self

    # -- forward ---------------------------------------------------------------------------------

    def _clip_stream(self, clip_ids: torch.Tensor, layout: ClipLayout | None
                     ) -> tuple[torch.Tensor, torch.Tensor, ClipLayout]:
        """CLIP token features (B, n_blocks*context, W), their mask (B, n_blocks*context) and layout."""
        batch, n_blocks, context = clip_ids.shape
        if context != self.context_length:
            raise ValueError(f"CLIP blocks have {context} positions, the CLIP model expects {self.context_length}")
        mask = clip_block_mask(clip_ids, self.config.clip_eot_id)
        if layout is None:
            layout = ClipLayout.of(mask)
        if self.placeholder is not None:
            if n_blocks > self.config.clip_blocks:
                raise ValueError(f"the placeholder covers {self.config.clip_blocks} CLIP blocks, the batch has {n_blocks}; raise `clip_blocks`")
            features = self.placeholder[: n_blocks * context].unsqueeze(0).expand(batch, -1, -1)
        else:
            features = self.clip(clip_ids, mask, layout)
        return features, mask.reshape(batch, n_blocks * context), layout

    def _encode(self, bert_ids, bert_mask, clip_ids, output_attentions=False, token_type_ids=None, language_cls_only=False,
                clip_output=True, clip_layout=None):
        """(language, clip, clip_mask, attentions, kept): `kept` indexes the CLIP positions the cross layers
        saw (None: all of them). `language_cls_only`: the last cross layer computes only the language
        [CLS], (B, 1, H), and clip is None; `clip_output=False`: it computes no CLIP stream, and clip is
        None (see `CrossModalLayer`). `clip_layout`: `ClipLayout.of` the CLIP mask, found on the host."""
        if language_cls_only and output_attentions:
            raise ValueError("language_cls_only skips the last layer's CLIP stream: it cannot return its attention maps")
        streams = self._streams(bert_ids, bert_mask, clip_ids, token_type_ids, clip_layout)
        return self._cross(*streams, bert_mask, output_attentions, language_cls_only, clip_output)

    def _streams(self, bert_ids, bert_mask, clip_ids, token_type_ids=None, clip_layout=None):
        """(language, clip, clip_mask, layout): the encoder's and the CLIP tower's states before the cross
        layers, every CLIP position kept; the CLIP three are None without cross layers."""
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # not every encoder takes them
        language = self.encoder(input_ids=bert_ids, attention_mask=bert_mask, **types).last_hidden_state
        if not self.config.uses_clip:
            return language, None, None, None
        if clip_ids is None:
            raise ValueError("this model has cross layers: clip_ids are required")
        return language, *self._clip_stream(clip_ids, clip_layout)

    def _cross(self, language, clip, clip_mask, layout, bert_mask, output_attentions=False, language_cls_only=False,
               clip_output=True):
        """`_encode`'s result from `_streams`' states: the cross layers run over them."""
        if not self.config.uses_clip:
            return language, None, None, [], None
        # Positions that hold no token in any window of the batch are dropped before the cross layers: as
        # keys they are masked and their own states are never read, so only the cost changes. A finetuning
        # sentence fills about 20 of its block's 77 positions, so this is most of the work. Attention maps
        # keep the full layout (the analyses index it by CLIP position).
        kept = None if output_attentions else layout.kept
        if kept is not None:
            clip, clip_mask = clip[:, kept], clip_mask[:, kept]
        language_mask = bert_mask.bool()
        attentions = []
        last = len(self.cross_layers) - 1
        for i, layer in enumerate(self.cross_layers):
            language, clip, probs = layer(language, language_mask, clip, clip_mask, output_attentions,
                                          language_cls_only and i == last, clip_output or i != last)
            attentions.append(probs)
        return language, clip, clip_mask, attentions, kept

    def encode(self, bert_ids: torch.Tensor, bert_mask: torch.Tensor, clip_ids: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, language_cls_only: bool = False,
               clip_layout: ClipLayout | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(language hidden states after the cross layers (B, L, H), CLIP stream states (B, n_blocks*77, W)).

        Without cross layers the CLIP states are None and the language states are the encoder's output.
        CLIP positions that hold no token in any window of the batch are zero. Finetuning the full model
        (paper Table 8) classifies from the language [CLS]: `language_cls_only` returns it alone, (B, 1, H),
        and no CLIP states, skipping the last cross layer's work that nothing reads. `clip_layout`: as in
        `forward`.
        """
        language, clip, _, _, kept = self._encode(bert_ids, bert_mask, clip_ids, token_type_ids=token_type_ids,
                                                  language_cls_only=language_cls_only, clip_layout=clip_layout)
        if kept is not None and clip is not None:
            full = clip.new_zeros(clip.shape[0], clip_ids.shape[1] * clip_ids.shape[2], clip.shape[2])
            full[:, kept] = clip
            clip = full
        return language, clip

    def forward(self, bert_ids: torch.Tensor, bert_mask: torch.Tensor, clip_ids: torch.Tensor | None = None,
                mlm_labels: torch.Tensor | None = None, match_labels: torch.Tensor | None = None,
                cliptc_labels: torch.Tensor | None = None, output_attentions: bool = False,
                clip_layout: ClipLayout | None = None, mlm_positions: torch.Tensor | None = None,
                cliptc_positions: torch.Tensor | None = None, distill_labels: torch.Tensor | None = None,
                distill_positions: torch.Tensor | None = None, kl_labels: torch.Tensor | None = None,
                kl_positions: torch.Tensor | None = None) -> dict[str, Any]:
        """Losses of the enabled objectives whose labels are given, and their accuracy counts.

        Returns `loss` (unweighted sum; absent when no labels were given), `<name>_loss`,
        `<name>_count` and `<name>_correct` for each computed objective, and `cross_attentions`
        (per layer {"language": (B, heads, L, C), "clip": (B, clip_heads, C, L)}) if asked.
        Labels of objectives not in `config.losses` are ignored, so one batch format serves all variants.

        Found on the host with the batch (`locate`), these spare the forward every read of the device's
        data: `clip_layout` (`ClipLayout.of` the CLIP mask), `mlm_positions` (`target_positions(mlm_labels)`),
        `cliptc_positions` (`target_positions` of the CLIPTC labels at `clip_layout.kept`'s positions) and
        `distill_positions` (`target_positions(distill_labels)`). `distill_labels` (B, L): the flat CLIP position
        each BERT token is pulled towards, -100 where none (`xdbert.adaptation.masking.distill_targets`).
        `kl_labels` (B, L): at each masked token, the flat CLIP position of the token before it, -100 elsewhere
        (`xdbert.adaptation.masking.kl_targets`); `kl_positions`: `target_positions(kl_labels)`.
        """
        if output_attentions and cliptc_positions is not None and clip_layout is not None and clip_layout.kept is not None:
            raise ValueError("with output_attentions every CLIP position is kept: cliptc_positions index only clip_layout.kept's")
        streams = self._streams(bert_ids, bert_mask, clip_ids, clip_layout=clip_layout)
        language, clip, _, attentions, kept = self._cross(*streams, bert_mask, output_attentions,
                                                          clip_output=self.cliptc_head is not None)
        out: dict[str, Any] = {}
        total = []
        if self.mlm_head is not None and mlm_labels is not None:
            self._token_loss(out, "mlm", self.mlm_head, language, mlm_labels, mlm_positions)
            total.append(out["mlm_loss"])
        if self.match_head is not None and match_labels is not None:
            logits = self.match_head(language[:, 0])
            out["match_loss"] = F.cross_entropy(logits.float(), match_labels)
            out["match_count"] = _count(match_labels.numel(), logits.device)
            out["match_correct"] = (logits.argmax(-1) == match_labels).sum().detach()
            total.append(out["match_loss"])
        if self.cliptc_head is not None and cliptc_labels is not None:
            self._token_loss(out, "cliptc", self.cliptc_head, clip, _kept_labels(cliptc_labels, kept), cliptc_positions,
                             self.cliptc_classes, self.cliptc_class_of)
            total.append(out["cliptc_loss"])
        if self.distill_map is not None and distill_labels is not None:
            positions = target_positions(distill_labels) if distill_positions is None else distill_positions
            tower = controls.tower_states(self.clip, self.config.clip_eot_id, streams[1], clip_ids, clip_layout)
            distance = controls.distill_distance(self.distill_map, streams[0], tower, distill_labels, positions)
            total.append(self._control_loss(out, "distill", distance, positions))
        if self.mlm_head is not None and "kl" in self.losses and kl_labels is not None:
            if self.kl_encoder_ids is None:
                raise ValueError("kl's shared vocabulary is not set: call `controls.restrict_kl` first")
            positions = target_positions(kl_labels) if kl_positions is None else kl_positions
            tower = controls.tower_states(self.clip, self.config.clip_eot_id, streams[1], clip_ids, clip_layout)
            divergence = controls.kl_divergence(self.mlm_head, self.kl_encoder_ids, self.clip.token_embedding.weight,
                                                self.kl_clip_ids, language, tower, kl_labels, positions)
            total.append(self._control_loss(out, "kl", divergence, positions))
        if total:
            out["loss"] = torch.stack(total).sum()
        if output_attentions:
            out["cross_attentions"] = attentions
        return out

    @staticmethod
    def _control_loss(out: dict, name: str, summed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A control's mean over its targets (`controls`: a sum over at least one, so no target gives 0, not NaN)."""
        out[f"{name}_loss"] = summed / max(positions.numel(), 1)
        out[f"{name}_count"] = _count(positions.numel(), summed.device)
        return out[f"{name}_loss"]

    @staticmethod
    def _token_loss(out: dict, name: str, head: MaskedTokenHead, hidden: torch.Tensor, labels: torch.Tensor,
                    positions: torch.Tensor | None = None, classes: torch.Tensor | None = None,
                    class_of: torch.Tensor | None = None) -> None:
        """Vocabulary logits only at target positions: gather the rows first, then decode (n, vocab).
        `positions`: `target_positions(labels)`, found here when not given. With `classes` (ids, and
        `class_of` mapping each id to its place), only those ids are scored."""
        if positions is None:
            positions = target_positions(labels)
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        wanted = labels.reshape(-1).index_select(0, positions)
        if classes is not None:
            wanted = class_of[wanted]
        if positions.numel() == 0:
            out[f"{name}_loss"] = hidden.sum() * 0.0  # keeps the graph; cross_entropy of nothing is NaN
            out[f"{name}_count"] = _count(0, hidden.device)
            out[f"{name}_correct"] = _count(0, hidden.device)
            return
        logits = head(rows, classes)
        out[f"{name}_loss"] = F.cross_entropy(logits.float(), wanted)
        out[f"{name}_count"] = _count(positions.numel(), hidden.device)
        out[f"{name}_correct"] = (logits.argmax(-1) == wanted).sum().detach()


@contextlib.contextmanager
def clip_path_cut(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, the language stream's cross-attention sees CLIP's keys and values as zeros, in
    every cross layer of `model` (an `XDBertModel`, or a module holding one such as the finetuning kind
    `full`). The attended values are then exactly 0, so the language outputs no longer depend on the CLIP
    input at all, and no gradient reaches the CLIP side from them.

    Why it exists: gate B of the mechanism study (issue 55) must be shown able to fail, by printing FAIL
    with this path cut; tests/test_cross_path.py shows a label that only the CLIP input carries is learned
    through the path and not without it. Forward hooks, removed on exit, so a model never cut runs the same
    code and gives the same bits. The CLIP stream's own attention to the language is left as it is.
    """
    attentions = [layer.language_cross.attention for layer in model.modules() if isinstance(layer, CrossModalLayer)]
    if not attentions:
        raise ValueError(f"{type(model).__name__} has no cross-modal layers: there is no CLIP path to cut")
    handles = [linear.register_forward_hook(_zeros) for a in attentions for linear in (a.key, a.value)]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


def _zeros(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(output)  # a forward hook's return value replaces the module's output


def target_positions(labels: torch.Tensor) -> torch.Tensor:
    """Where `labels` (any shape) hold a target, as indices into its flattened form, in order."""
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def locate(batch: dict, eot_id: int, multiple: int = 1) -> dict:
    """Where a batch's CLIP tokens and targets are, as `forward` takes them: `clip_layout`, `mlm_positions`,
    `cliptc_positions` and `distill_positions`, for a batch of its inputs and labels. The adaptation batches
    call it on the host, where reading them costs nothing; the model itself would wait for the GPU at each.
    `multiple`: the layout's rounding (`ClipLayout.of`)."""
    out: dict = {}
    if batch.get("clip_ids") is not None:
        layout = out["clip_layout"] = ClipLayout.of(clip_block_mask(batch["clip_ids"], eot_id), multiple)
        if batch.get("cliptc_labels") is not None:
            out["cliptc_positions"] = target_positions(_kept_labels(batch["cliptc_labels"], layout.kept))
    if batch.get("mlm_labels") is not None:
        out["mlm_positions"] = target_positions(batch["mlm_labels"])
    if batch.get("distill_labels") is not None:
        out["distill_positions"] = target_positions(batch["distill_labels"])
    if batch.get("kl_labels") is not None:
        out["kl_positions"] = target_positions(batch["kl_labels"])
    return out


def _kept_labels(cliptc_labels: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """CLIPTC labels (B, n_blocks, context) at the CLIP positions the cross layers see, (B, positions).
    Targets are real tokens, so none is at a dropped position."""
    labels = cliptc_labels.reshape(len(cliptc_labels), -1)
    return labels if kept is None else labels[:, kept]


def _count(n: int, device: torch.device) -> torch.Tensor:
    # Filled on the device: `torch.tensor(n, device=...)` would copy n from pageable host memory.
    return torch.full((), n, dtype=torch.long, device=device)


# The new parts' initial weights, each from a generator of its own: seeded from the model's seed
# (`torch.initial_seed()`, which `build_xdbert` sets to `model.seed`) and the part's name. So the parts two
# variants share start identical (Table 3 compares losses, not initialisations), whatever else each builds
# first: a CLIP tower or a placeholder, other heads, one cross layer or two (the first is the same).
PART_SEEDS = {"cross_layers": 1, "match_head": 2, "mlm_head": 3, "cliptc_head": 4, "placeholder": 5, "distill_map": 6}


def part_generator(part: str) -> torch.Generator:
    return torch.Generator().manual_seed((torch.initial_seed() + PART_SEEDS[part]) % 2**63)


def _init_bert_style(module: nn.Module | None, std: float, generator: torch.Generator) -> None:
    if module is None:
        return
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std, generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


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
        raise ValueError(f"unknown part {part!r}; allowed: {', '.join(PARTS)}")
    return sum(p.numel() for p in parts[part].values())
