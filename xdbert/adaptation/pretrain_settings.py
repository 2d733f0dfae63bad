"""The `pretrain` section, every value checked once, before anything heavy is imported: apart from the `adapt`
section's settings, so that a stage reading one does not rerun on a change to the other."""
from __future__ import annotations

from dataclasses import dataclass, fields

from xdbert import params as P
from xdbert.errors import PipelineError

# Every key of the section (a typo among them is refused when the section's settings are built)
PRETRAIN_KEYS = ("steps", "batch_size", "lr", "mlm_prob", "restate_mask_prob", "warmup_ratio", "weight_decay",
                 "max_len", "checkpoint_every", "seed", "clip_steps")


@dataclass(frozen=True)
class PretrainSettings:
    """One pretraining stand-in's run (`xdbert.adaptation.pretraining`); `steps` is the stand-in's own."""

    steps: int
    batch_size: int
    lr: float
    mlm_prob: float          # targets in the first sentence
    restate_mask_prob: float  # targets in the restating second sentence
    warmup_ratio: float
    weight_decay: float
    max_len: int
    checkpoint_every: int
    seed: int

    @classmethod
    def from_params(cls, params: dict) -> "PretrainSettings":
        """The encoder's stand-in (stages `pretrain_encoder@<family>`): `pretrain.steps` of MLM on restated pairs."""
        values = _values(P.section(params, "pretrain", PRETRAIN_KEYS), [f.name for f in fields(cls)])
        for key in ("steps", "batch_size", "max_len", "checkpoint_every"):  # stored as integers: `steps: 2.0` passes
            values[key] = P.positive(values[key], f"pretrain.{key}")
        P.positive(values["lr"], "pretrain.lr", float)
        for key in ("mlm_prob", "restate_mask_prob", "warmup_ratio", "weight_decay"):
            P.fraction(values[key], f"pretrain.{key}")
        if values["mlm_prob"] == 0:
            raise PipelineError("`pretrain.mlm_prob` must be above 0: at 0 the stand-in's MLM has no target to learn")
        P.non_negative(values["seed"], "pretrain.seed")
        return cls(**values)

    @classmethod
    def clip_from_params(cls, params: dict, clip_pretrained: str) -> "PretrainSettings | None":
        """The CLIP tower's stand-in (stage `pretrain_clip`): `pretrain.clip_steps` of next-token prediction,
        or None when no tower is trained (pretrained weights, or `clip_steps: 0`). Only the values that
        training reads are checked; the masking and length keys are the encoder stand-in's."""
        s = P.section(params, "pretrain", PRETRAIN_KEYS)
        steps = P.get(s, "clip_steps", "pretrain")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise PipelineError(f"`pretrain.clip_steps` must be an integer >= 0 (0 = keep a random CLIP tower random); got {steps!r}")
        if clip_pretrained or steps == 0:
            return None
        values = _values(s, [f.name for f in fields(cls) if f.name != "steps"])
        for key in ("batch_size", "checkpoint_every"):
            values[key] = P.positive(values[key], f"pretrain.{key}")
        P.positive(values["lr"], "pretrain.lr", float)
        for key in ("warmup_ratio", "weight_decay"):
            P.fraction(values[key], f"pretrain.{key}")
        P.non_negative(values["seed"], "pretrain.seed")
        return cls(**values, steps=steps)


def _values(section: dict, keys: list[str]) -> dict:
    return {key: P.get(section, key, "pretrain") for key in keys}
