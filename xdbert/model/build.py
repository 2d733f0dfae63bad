"""The cross-modal model an adaptation variant trains, assembled from params as the `adapt` stage starts it.

`build_xdbert` takes these steps:

1. the CLIP tower as the `pretrain_clip` stage left it (`pretrained_clip_tower`), where the variant has one;
2. `torch.manual_seed(model.seed)`: the seed of the new parts' initial weights, each drawn from a generator
   of its own (`xdbert.model.modeling.part_generator`), so the parts two variants share start identical;
3. the model of `xdbert_config` around that tower: the encoder from `encoder_source` (a random encoder's
   pretraining stand-in, or the hub id), the variant's cross layers, losses and heads;
4. CLIPTC's classes restricted to the CLIP ids of the token shards (`adapt.cliptc_vocab: shards`);
5. the CLIP tower frozen (`adapt.freeze_clip`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from xdbert import paths
from xdbert.errors import PipelineError
from xdbert.model.clip_tower import CLIPTextTower
from xdbert.model.encoders import random_encoder_config
from xdbert.model.modeling import XDBertConfig, XDBertModel
from xdbert.model.saving import load_clip_tower
from xdbert.model.settings import ModelSettings
from xdbert.random_encoder import RANDOM_PREFIX


def encoder_source(encoder: str, encoder_config: dict | None = None, family: str = "") -> str:
    """Where adaptation (and everything that starts from the original encoder) loads family `family`'s
    encoder: the pretrained stand-in for a `random:<type>` encoder, the hub id or folder otherwise."""
    if not encoder.startswith(RANDOM_PREFIX):
        return encoder
    random_encoder_config(encoder, encoder_config)  # an unknown model type is named here
    source = paths.pretrain_encoder(family)
    if not family or not (source / "config.json").is_file():
        raise PipelineError(f"missing {source}: family {family!r}'s `{encoder}` encoder starts from its pretraining "
                            f"stand-in; run `dvc repro pretrain_encoder@{family or '<family>'}`")
    return str(source)


class Variant(Protocol):
    """What the model of an adaptation variant is built from (`xdbert.adaptation.settings.AdaptSettings`)."""

    losses: list
    cross_layers: int
    clip_heads: int
    placeholder: bool
    init_range: float | None
    cliptc_vocab: str
    freeze_clip: bool


def xdbert_config(model: ModelSettings, variant: Variant, *, vocab_size: int, clip_blocks: int,
                  clip_eot_id: int) -> XDBertConfig:
    """The config of a variant's model: `vocab_size` of the trained tokenizer, `clip_blocks` per window."""
    return XDBertConfig(
        encoder=encoder_source(model.encoder, model.encoder_config, model.family), encoder_config=model.encoder_config,
        vocab_size=vocab_size, clip=model.clip, clip_pretrained=model.clip_pretrained, clip_heads=variant.clip_heads,
        clip_blocks=clip_blocks, cross_layers=variant.cross_layers, losses=variant.losses,
        placeholder=variant.placeholder, clip_eot_id=clip_eot_id, init_range=variant.init_range)


def check_clip_heads(clip: str, heads: int) -> None:
    """The cross layers' CLIP stream splits the width of CLIP's text tower into `heads` heads (`adapt.clip_heads`,
    or a variant's own: the adapt stage names the key). Raises ValueError with the heads that would."""
    import open_clip

    from xdbert.clip import check_name

    width = open_clip.get_model_config(check_name(clip))["text_cfg"]["width"]
    if width % heads:
        allowed = [h for h in range(1, min(width, 64) + 1) if width % h == 0]
        raise ValueError(f"{heads} does not divide the width {width} of CLIP's text tower `{clip}`; "
                         f"allowed: {', '.join(map(str, allowed))}")


def build_xdbert(model: ModelSettings, variant: Variant, *, vocab_size: int, clip_blocks: int, clip_eot_id: int,
                 splits: Sequence, clip_tower: Path = paths.PRETRAIN_CLIP) -> XDBertModel:
    """The model a variant's adaptation starts from; `splits` are the token shards it trains and evaluates on."""
    config = xdbert_config(model, variant, vocab_size=vocab_size, clip_blocks=clip_blocks, clip_eot_id=clip_eot_id)
    tower = None
    if config.has_tower:  # loaded, not built: the hub's weights are not needed twice
        tower, config.clip_quick_gelu = pretrained_clip_tower(model, clip_tower)
    torch.manual_seed(model.seed)
    xdbert = XDBertModel.build(config, clip=tower)
    if variant.cliptc_vocab == "shards" and xdbert.cliptc_head is not None:
        xdbert.restrict_cliptc(shard_clip_ids(splits))
    if variant.freeze_clip and xdbert.clip is not None:
        xdbert.clip.requires_grad_(False)
    return xdbert


def pretrained_clip_tower(model: ModelSettings, directory: Path = paths.PRETRAIN_CLIP) -> tuple[CLIPTextTower, bool]:
    """(tower, whether it uses QuickGELU): the tower the `pretrain_clip` stage left, the downloaded weights
    (paper profile) or the embedded profile's stand-in, a random tower trained as a causal language model
    on the corpus."""
    tower, saved = load_clip_tower(directory)
    if (saved["clip"], saved["clip_pretrained"]) != (model.clip, model.clip_pretrained):
        raise PipelineError(f"{directory} holds {saved['clip']} ({saved['clip_pretrained'] or 'random init'}), "
                            f"params ask for {model.clip} ({model.clip_pretrained or 'random init'}): run `dvc repro pretrain_clip`")
    return tower, saved["clip_quick_gelu"]


def shard_clip_ids(splits: Sequence) -> torch.Tensor:
    """Every CLIP id in the windows of `splits` (token shards), sorted: the only ids CLIPTC can have as targets."""
    used = [np.unique(split.column("clip_ids")) for split in splits]
    return torch.from_numpy(np.unique(np.concatenate(used)).astype(np.int64))
