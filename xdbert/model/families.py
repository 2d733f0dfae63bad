"""The `families` section: each language encoder FAMILY the study adapts and finetunes (the paper: BERT-b,
ELECTRA-b, ELECTRA-l, Table 1's rows two by two). A family's entry names what differs from `model` (its
`encoder` and `encoder_config`, merged by xdbert.model.settings) and what is its own: the label of its Table 1
row, Table 5's size class and the finetuning recipe's layer-wise learning-rate decay. `adapt.family` is the
family of Table 3's ablations.

Apart from the `model` section's settings, so that a stage that reads families but no `model` key does not
depend on them. Imports nothing heavy.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.errors import PipelineError

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


def entries(params: dict) -> dict:
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
    return list(entries(params))


def family(params: dict, name: str) -> Family:
    """Family `name` of `families`, checked; an unknown name gets the list of the study's families."""
    families = entries(params)
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
    return {name: family(params, name) for name in entries(params)}


def ablation_family(params: dict) -> Family:
    """`adapt.family`: the family whose `adapt.variants` are adapted (Table 3; the attention and grounding analyses)."""
    name = P.get(P.section(params, "adapt"), "family", "adapt")
    if not isinstance(name, str) or name not in entries(params):
        raise PipelineError(f"`adapt.family` names {name!r}, which is not a family; allowed: {', '.join(entries(params))}")
    return family(params, name)
