"""The `model` and `families` sections: the language encoders and the CLIP text tower every stage builds on.

The study adapts and finetunes each encoder FAMILY of `families` (the paper: BERT-b, ELECTRA-b, ELECTRA-l,
Table 1's rows two by two). A family's entry names what differs from `model` (its `encoder` and
`encoder_config`) and what is its own: the label of its Table 1 row, Table 5's size class and the
finetuning recipe's layer-wise learning-rate decay. `adapt.family` is the family of Table 3's ablations.

Imports nothing heavy, so a stage checks its params before it pays for torch and transformers. What only
the libraries can tell (an unknown `random:<model_type>`, an unknown open_clip name or tag) is checked
where the encoder or tower is built, with the same full key in the message.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.errors import PipelineError

# The transformers config keys of `encoder_config` the profiles set, checked here. Sizes must be integers as
# written: stages pass the mapping to transformers as it is in params.yaml. Any other key goes to the config as
# written; that each is a setting of the model type is checked by `random_default_config` (xdbert/random_encoder.py), which imports
# transformers (`xdbert check`, dual_tokenize, pretrain_encoder, and wherever a random encoder is built).
CONFIG_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings",
                "embedding_size")  # ELECTRA's embedding width
CONFIG_FRACTIONS = ("hidden_dropout_prob", "attention_probs_dropout_prob")


SIZES = ("base", "large")   # Table 5's columns of learning rates
FAMILY_KEYS = ("label", "size", "layer_lr_decay", "encoder", "encoder_config")


@dataclass(frozen=True)
class Family:
    """One language encoder of the study: its name (a key of `families`) and its own settings."""

    name: str
    label: str              # Table 1's row of its baseline, e.g. BERT-b; its adapted encoder's row is XD + label
    size: str               # Table 5's learning-rate column: base | large
    layer_lr_decay: float   # finetuning: lr * decay^depth below the top layer; 1.0 = off

    @property
    def xd_label(self) -> str:
        """The adapted encoder's row (XDBERT-b, XDELECTRA-l)."""
        return "XD" + self.label

    @property
    def full_label(self) -> str:
        """The whole cross-modal model's row in Table 8 (XBERT-b, XELECTRA-l)."""
        return "X" + self.label


def _entries(params: dict) -> dict:
    families = P.section(params, "families")
    if not families:
        raise PipelineError("`families` must name at least one language encoder, e.g. {bert-b: {label: BERT-b, size: base, "
                            "layer_lr_decay: 1.0}}")
    for name, entry in families.items():
        if not isinstance(name, str) or not P.NAME.fullmatch(name):
            raise PipelineError(f"`families` has the name {name!r}: a family's name must be letters, digits, _ and - "
                                f"(it names stages such as adapt@<name> and their folders)")
        if not isinstance(entry, dict):
            raise PipelineError(f"`families.{name}` must map {', '.join(FAMILY_KEYS)} to values; got {entry!r}")
        unknown = sorted(set(entry) - set(FAMILY_KEYS), key=str)
        if unknown:
            raise PipelineError(f"`families.{name}` has unknown keys {unknown}; allowed: {', '.join(FAMILY_KEYS)}")
    return families


def family_names(params: dict) -> list[str]:
    return list(_entries(params))


def family(params: dict, name: str) -> Family:
    """Family `name` of `families`, checked; an unknown name gets the list of the study's families."""
    families = _entries(params)
    if name not in families:
        raise PipelineError(f"unknown family {name!r}; the study's families (`families`): {', '.join(families)}")
    entry, where = families[name], f"families.{name}"
    label = P.nonempty_str(P.get(entry, "label", where), f"{where}.label")
    size = P.choice(P.get(entry, "size", where), f"{where}.size", SIZES)
    decay = P.get(entry, "layer_lr_decay", where)
    if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 < decay <= 1:
        raise PipelineError(f"`{where}.layer_lr_decay` must be in (0, 1] (1.0 = off; ELECTRA's recipe: 0.8 base, 0.9 large); "
                            f"got {decay!r}")
    return Family(name, label, size, float(decay))


def families(params: dict) -> dict[str, Family]:
    """Every family of the study, in the order of `families` (Table 1's rows)."""
    return {name: family(params, name) for name in _entries(params)}


def ablation_family(params: dict) -> Family:
    """`adapt.family`: the family whose `adapt.variants` are adapted (Table 3; the attention and grounding analyses)."""
    name = P.get(P.section(params, "adapt"), "family", "adapt")
    if not isinstance(name, str) or name not in _entries(params):
        raise PipelineError(f"`adapt.family` names {name!r}, which is not a family; allowed: {', '.join(_entries(params))}")
    return family(params, name)


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
        m = P.section(params, "model")
        own = {}
        if family_name:
            family(params, family_name)
            own = _entries(params)[family_name]
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
