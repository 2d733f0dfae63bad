"""The `probes` params section, checked: the visual-knowledge probes' inputs (PROBES.md, issue 56).

ViComTe's files are provided by hand under `vicomte_dir` (xdbert.data.vicomte); CoDa and the reference model
(`bert-base-cased`, the encoder ViComTe's published figures are for) come from the hub, pinned by `xdbert fetch`
at the revision `hub.revisions` asks for. Off in the embedded and micro profiles: their encoders are small random
stand-ins that know no colour, shape or material, and the data cannot be generated with any meaning.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdbert import params as P
from xdbert.data import provided, vicomte
from xdbert.data.vicomte import RELATIONS
from xdbert.errors import PipelineError


PROBES_KEYS = ("enabled", "vicomte_dir", "relations", "coda_hub_id", "reference", "cv_folds", "n_boot")  # a typo: refused


@dataclass(frozen=True)
class ProbesSettings:
    """The `probes` params section, checked whether or not it is enabled."""

    enabled: bool
    vicomte_dir: Path          # ViComTe's mine-data/ and soft-prompts/, as in the authors' repository
    relations: tuple[str, ...]  # of ViComTe's color, shape and material
    coda_hub_id: str
    reference: str             # the reference row's encoder, a hub id
    cv_folds: int              # the k of the cross-validation on train that chooses a template
    n_boot: int                # bootstrap resamples of each paired difference

    @classmethod
    def from_params(cls, params: dict) -> "ProbesSettings":
        get = P.getter(P.section(params, "probes", PROBES_KEYS), "probes")
        relations = P.subset(get("relations"), "probes.relations", RELATIONS)
        if len(set(relations)) != len(relations):
            raise PipelineError(f"`probes.relations` lists a relation twice: {relations}")
        return cls(enabled=P.flag(get("enabled"), "probes.enabled"),
                   vicomte_dir=Path(P.nonempty_str(get("vicomte_dir"), "probes.vicomte_dir")),
                   relations=tuple(relations),
                   coda_hub_id=P.nonempty_str(get("coda_hub_id"), "probes.coda_hub_id"),
                   reference=P.nonempty_str(get("reference"), "probes.reference"),
                   cv_folds=_folds(get("cv_folds")),
                   n_boot=P.positive(get("n_boot"), "probes.n_boot"))


def _folds(value) -> int:
    folds = P.positive(value, "probes.cv_folds")
    if folds < 2:
        raise PipelineError(f"`probes.cv_folds` must be an integer >= 2 (folds of the cross-validation on train); got {value!r}")
    return folds


def vicomte_files(s: ProbesSettings) -> list[tuple[str, Path]]:
    """(param, path) of every ViComTe file settings `s` expect a user to have put in place (none with the probes
    off): the relations' files, then the CoDa templates; as xdbert.data.provided.files lists the other hand-provided
    files; `xdbert fetch` checks them with those."""
    if not s.enabled:
        return []
    paths = [*(path for relation in s.relations for path in vicomte.files(s.vicomte_dir, relation)),
             vicomte.coda_templates_file(s.vicomte_dir)]
    return [(provided.VICOMTE, path) for path in paths]


def check_vicomte_files(s: ProbesSettings) -> None:
    """ViComTe's files are there and in their format, before any model is loaded: the probes stage's check of
    its hand-provided inputs (a PipelineError naming the first file that is not)."""
    provided.check_files(vicomte_files(s))
