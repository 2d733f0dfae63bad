"""`xdbert check`: every stage's params check on one params file, at once, writing nothing.

Each stage checks the sections it reads when it starts (its settings object), so a bad value in the params of
a late stage would show only when `dvc repro` reaches it, hours in. This runs all of those checks in a second:
first every section's keys (each kept beside its settings: SECTION_KEYS gathers them), so that a typo in a section
no stage has read yet is refused too; then every family, every adapt variant and the baseline, every task of
`tasks.names` for finetune, every other settings object.
Then the names one section gives another: a finetuned model is an adapt variant, the analyses' tasks are
finetuned, grounding compares two runs that exist. The stages check those by the files they read.

Not checked here: what only files or libraries can tell (hub ids, open_clip names, model and caption files,
the positions of a pretrained encoder); each stage checks them when it starts. Nothing heavy is imported.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from xdbert import params as P
from xdbert.adaptation.pretrain_settings import PRETRAIN_KEYS, PretrainSettings
from xdbert.adaptation.settings import ADAPT_KEYS, AdaptSettings, setting_key
from xdbert.analysis.attention import ATTENTION_KEYS, AttentionSettings
from xdbert.analysis.grounding_settings import GROUNDING_KEYS, GroundingSettings
from xdbert.analysis.pwcca import PWCCA_KEYS, PwccaSettings
from xdbert.data.captions import CaptionSettings
from xdbert.data.corpus import CORPUS_KEYS, CorpusSettings
from xdbert.data.mechanism import MECHANISM_KEYS, VIS, MechanismSettings
from xdbert.data.probes import PROBES_KEYS, ProbesSettings
from xdbert.data.tasks.registry import get_task
from xdbert.data.tasks.settings import TASKS_KEYS, TasksSettings
from xdbert.data.tokenization.build import TOKENIZE_KEYS, Settings as TokenizeSettings
from xdbert.data.tokenization.vocab import check_positions, encoder_positions
from xdbert.errors import PipelineError
from xdbert.fetch import HUB_KEYS, requested_revisions
from xdbert.finetuning.control.settings import FINETUNE_KEYS, FinetuneSettings
from xdbert.model.families import ablation_family, family_names
from xdbert.model.settings import MODEL_KEYS, ModelSettings
from xdbert.paths import PRETRAIN_CLIP, PRETRAIN_CLIP_NOFACTS
from xdbert.random_encoder import RANDOM_PREFIX
from xdbert.reports.settings import AGGREGATE_KEYS, AggregateSettings

# Every section's keys, by section in params.SECTIONS' order, gathered from beside their settings; `families`
# maps the user's family names to their entries (checked by xdbert.model.families.Family). tests/test_foundation.py
# keeps this equal to the profiles' keys.
SECTION_KEYS = {"corpus": CORPUS_KEYS, "tasks": TASKS_KEYS, "mechanism": MECHANISM_KEYS, "model": MODEL_KEYS,
                "families": None, "hub": HUB_KEYS, "tokenize": TOKENIZE_KEYS, "pretrain": PRETRAIN_KEYS,
                "adapt": ADAPT_KEYS, "pwcca": PWCCA_KEYS, "grounding": GROUNDING_KEYS, "attention": ATTENTION_KEYS,
                "finetune": FINETUNE_KEYS, "aggregate": AGGREGATE_KEYS, "probes": PROBES_KEYS}


def check_file(path: str | Path = "params.yaml") -> dict:
    """The params of `path`, loaded and checked; a `PipelineError` names the first bad key."""
    params = P.load(path)
    check(params)
    return params


def check(p: dict) -> None:
    """Every section's keys, every stage's settings check on params `p` in the order of the stage graph, then the
    cross-references."""
    check_keys(p)
    CorpusSettings.from_params(p)
    tasks = TasksSettings.from_params(p)
    model = ModelSettings.from_params(p)
    ablation_family(p)
    requested_revisions(p)
    tokenize = TokenizeSettings.from_params(P.section(p, "tokenize"))
    pretrain = PretrainSettings.from_params(p)
    for name in ["", *family_names(p)]:  # the tokenizer's encoder, then every family's
        m = ModelSettings.from_params(p, name)
        if m.encoder.startswith(RANDOM_PREFIX):
            # the stages' own checks (dual_tokenize; pretrain_encoder trains only random encoders); a
            # pretrained encoder's config comes from the hub, which `xdbert check` does not ask
            positions = encoder_positions(m.encoder, m.encoder_config)
            check_positions("tokenize.max_len", tokenize.max_len, positions, m.encoder)
            if name:
                check_positions("pretrain.max_len", pretrain.max_len, positions, m.encoder)
    PretrainSettings.clip_from_params(p, model.clip_pretrained)
    variants = P.variant_names(p)
    mechanism = MechanismSettings.from_params(p)
    for variant in [P.PROPOSED, P.BASELINE, *variants]:
        adapt = AdaptSettings.from_params(p, variant)
        if adapt.clip_tower == PRETRAIN_CLIP_NOFACTS.name and not mechanism.enabled:
            # the twin tower exists only in the mechanism study's world (the paper profile has none)
            raise PipelineError(f"`{setting_key(p, variant, 'clip_tower')}` is {adapt.clip_tower}, the mechanism study's twin "
                                f"tower, but `mechanism.enabled` is false (the paper profile): remove the variant "
                                f"{variant!r} or use {PRETRAIN_CLIP.name}")
    if mechanism.enabled:
        _named("mechanism.models", mechanism.models, [P.BASELINE, P.PROPOSED, *variants], "the baseline or an adapt variant")
        _named("mechanism.full_models", mechanism.full_models, [P.PROPOSED, *variants], "an adapt variant with CLIP")
    for name in [*tasks.names, *([VIS] if mechanism.enabled else [])]:  # as the finetune stage reads them
        FinetuneSettings.from_params(p, get_task(name), mechanism)
    study = AggregateSettings.from_params(p).study
    PwccaSettings.from_params(p, files=False)
    grounding = GroundingSettings.from_params(p, files=False)
    CaptionSettings.from_params(p)
    attention = AttentionSettings.from_params(p, files=False)
    ProbesSettings.from_params(p)

    _named("attention.task", [attention.task], tasks.names, "in tasks.names (its dev split is read)")
    for task in grounding.tasks:
        runs = [run.name for run in study.runs(task)]
        _named("grounding.baseline", [grounding.baseline], runs, f"a finetune run of `adapt.family` on {task}")
        _named("grounding.model", [grounding.model], runs, f"a finetune run of `adapt.family` on {task}")


def _named(key: str, names: Iterable[str], allowed: Iterable[str], what: str) -> None:
    allowed = list(allowed)
    for name in names:
        if name not in allowed:
            raise PipelineError(f"`{key}` names {name!r}, which is not {what}; allowed: {', '.join(allowed)}")


def check_keys(p: dict) -> None:
    """Every key of every section of `p` is known (a section `p` lacks, or that maps no keys, its settings refuse)."""
    for name, keys in SECTION_KEYS.items():
        if keys is not None and isinstance(p.get(name), dict):
            P.check_keys(p[name], name, keys)

