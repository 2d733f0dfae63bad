"""The `model` section: the language encoder and the CLIP text tower every stage builds on, and a family's
encoder merged over it (`ModelSettings.from_params(p, family)`; the families themselves: xdbert.model.families).

Imports nothing heavy, so a stage checks its params before it pays for torch and transformers. What only
the libraries can tell (an unknown `random:<model_type>`, an unknown open_clip name or tag) is checked
where the encoder or tower is built, with the same full key in the message.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.model.families import entries, family

# The transformers config keys of `encoder_config` the profiles set, checked here. Sizes must be integers as
# written: stages pass the mapping to transformers as it is in params.yaml. Any other key goes to the config as
# written; that each is a setting of the model type is checked by `random_default_config` (xdbert/random_encoder.py), which imports
# transformers (`xdbert check`, dual_tokenize, pretrain_encoder, and wherever a random encoder is built).
CONFIG_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings",
                "embedding_size")  # ELECTRA's embedding width
CONFIG_FRACTIONS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
MODEL_KEYS = ("encoder", "encoder_config", "clip", "clip_pretrained", "seed")  # a typo among them is refused


def _encoder_config(value, where: str) -> dict:
    if value is None:  # absent, or `encoder_config:` with nothing after it: no overrides
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise PipelineError(f"`{where}` must map transformers config keys to values; got {value!r}")
    return value


@dataclass(frozen=True)
class ModelSettings:
    encoder: str          # a hub id or local folder (pretrained), or random:<model_type>
    encoder_config: dict  # transformers config overrides, only for random:<model_type>
    clip: str             # an open_clip model name
    clip_pretrained: str  # an open_clip pretrained tag or checkpoint file; "" = random weights
    seed: int             # initial weights of random encoders and random CLIP towers
    family: str = ""      # the family whose encoder this is; "" = `model`'s own encoder (the tokenizer's)

    @classmethod
    def from_params(cls, params: dict, family_name: str = "") -> "ModelSettings":
        """`model`, with family `family_name`'s `encoder` and `encoder_config` (merged key by key) where it names them."""
        m = P.section(params, "model", MODEL_KEYS)
        own = {}
        if family_name:
            family(params, family_name)
            own = entries(params)[family_name]
        where = f"families.{family_name}" if family_name else "model"
        encoder = P.nonempty_str(own["encoder"] if "encoder" in own else P.get(m, "encoder", "model"),
                                 f"{where if 'encoder' in own else 'model'}.encoder")
        own_config = _encoder_config(own.get("encoder_config"), f"{where}.encoder_config")
        encoder_config = {**_encoder_config(m.get("encoder_config"), "model.encoder_config"), **own_config}

        def key_of(key: str) -> str:  # the key a value came from: the family's override or `model`'s
            return f"{where if key in own_config else 'model'}.encoder_config.{key}"

        for key, value in encoder_config.items():
            if key in CONFIG_SIZES and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise PipelineError(f"`{key_of(key)}` must be a positive integer; got {value!r}")
            if key in CONFIG_FRACTIONS:
                P.fraction(value, key_of(key))
        width, heads = encoder_config.get("hidden_size"), encoder_config.get("num_attention_heads")
        if width and heads and width % heads:
            raise PipelineError(f"`{key_of('hidden_size')}` ({width}) must be a multiple of `{key_of('num_attention_heads')}` "
                                f"({heads}): each head takes an equal share")
        clip = P.nonempty_str(P.get(m, "clip", "model"), "model.clip")
        clip_pretrained = P.get(m, "clip_pretrained", "model")
        if not isinstance(clip_pretrained, str):
            raise PipelineError(f"`model.clip_pretrained` must be an open_clip pretrained tag such as openai, a checkpoint "
                                f'file, or "" for random weights; got {clip_pretrained!r}')
        seed = P.non_negative(P.get(m, "seed", "model"), "model.seed")
        return cls(encoder=encoder, encoder_config=encoder_config, clip=clip, clip_pretrained=clip_pretrained, seed=seed,
                   family=family_name)
