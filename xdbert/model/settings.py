"""The `model` section: the language encoder and CLIP text tower every stage builds on.

Imports nothing heavy, so a stage checks its params before it pays for torch and transformers. What only
the libraries can tell (an unknown `random:<model_type>`, an unknown open_clip name or tag) is checked
where the encoder or tower is built, with the same full key in the message.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.errors import PipelineError

# The transformers config keys of `encoder_config` the profiles set, checked here. Sizes must be integers as
# written: stages pass the mapping to transformers as it is in params.yaml. Any other key goes to the config
# unchecked (transformers has hundreds, per model type).
CONFIG_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings")
CONFIG_FRACTIONS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclass(frozen=True)
class ModelSettings:
    encoder: str          # a hub id or local folder (pretrained), or random:<model_type>
    encoder_config: dict  # transformers config overrides, only for random:<model_type>
    clip: str             # an open_clip model name
    clip_pretrained: str  # an open_clip pretrained tag or checkpoint file; "" = random weights
    seed: int             # initial weights of random encoders and random CLIP towers

    @classmethod
    def from_params(cls, params: dict) -> "ModelSettings":
        m = P.section(params, "model")
        encoder = P.nonempty_str(P.get(m, "encoder", "model"), "model.encoder")
        encoder_config = m.get("encoder_config")
        if encoder_config is None:  # absent, or `encoder_config:` with nothing after it: no overrides
            encoder_config = {}
        if not isinstance(encoder_config, dict) or not all(isinstance(k, str) for k in encoder_config):
            raise PipelineError(f"`model.encoder_config` must map transformers config keys to values; got {encoder_config!r}")
        for key, value in encoder_config.items():
            if key in CONFIG_SIZES and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise PipelineError(f"`model.encoder_config.{key}` must be a positive integer; got {value!r}")
            if key in CONFIG_FRACTIONS:
                P.fraction(value, f"model.encoder_config.{key}")
        width, heads = encoder_config.get("hidden_size"), encoder_config.get("num_attention_heads")
        if width and heads and width % heads:
            raise PipelineError(f"`model.encoder_config.hidden_size` ({width}) must be a multiple of "
                                f"`model.encoder_config.num_attention_heads` ({heads}): each head takes an equal share")
        clip = P.nonempty_str(P.get(m, "clip", "model"), "model.clip")
        clip_pretrained = P.get(m, "clip_pretrained", "model")
        if not isinstance(clip_pretrained, str):
            raise PipelineError(f"`model.clip_pretrained` must be an open_clip pretrained tag such as openai, a checkpoint "
                                f'file, or "" for random weights; got {clip_pretrained!r}')
        seed = P.non_negative(P.get(m, "seed", "model"), "model.seed")
        return cls(encoder=encoder, encoder_config=encoder_config, clip=clip, clip_pretrained=clip_pretrained, seed=seed)
