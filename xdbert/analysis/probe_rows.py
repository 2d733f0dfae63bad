"""The probes study's rows (issue 56, ../shared/PROBES.md): which encoders it probes, and each one loaded.

Rows: each family's MLM baseline and XDBERT (Table 1), the variants of `adapt.family` (Table 3), CLIP-T (its text
features), the `probes.reference` encoder from its pinned hub snapshot, and the caption-text control (the variant
CAPTION_CONTROL, where `adapt.variants` has it). ViComTe's linear probe runs on every row; the zero-shot cloze and
CoDa only on rows whose MLM head was trained on that encoder's own output and saved: the reference (its hub head),
the baselines and a caption control without cross layers (their heads in models/crossmodal). Never XDBERT or a
Table 3 variant: their head read the cross layers' output, not the encoder's.

Models load as the other stages load them, hub ids through their pins (xdbert.hub); torch only inside `load_row`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.model.files import CLIP_CONFIG, CROSSMODAL_CONFIG
from xdbert.model.families import ablation_family, family_names
from xdbert.paths import PRETRAIN_CLIP, TOKENIZER, adapted, crossmodal

CAPTION_CONTROL = "caption_mlm"  # the adapt variant of the caption-text control (the baseline's MLM recipe on captions)
CLIP_ROW = "clip_t"
BATCH_SIZE = 32                  # texts per forward pass; the features do not depend on it


class Row(NamedTuple):
    """One row of the report: where its encoder is, and where its MLM head is (None: no cloze)."""

    name: str
    role: str                  # xdbert.analysis.probes.ROLES
    family: str | None
    kind: str                  # "encoder" (an adapted folder), "clip" (a CLIP tower folder), "hub" (a hub id)
    source: str                # the folder or the hub id
    head: str | None = None    # "hub" (the hub model's own), a models/crossmodal folder, or None

    def entry(self) -> dict:
        return {"name": self.name, "role": self.role, "family": self.family}


def study_rows(p: dict, reference: str) -> list[Row]:
    """The rows under params `p`, in the report's order; `reference` the reference row's hub id."""
    fam = ablation_family(p).name
    variants = P.variant_names(p)
    rows = []
    for f in family_names(p):
        rows += [Row(f"{f}/{P.BASELINE}", "baseline", f, "encoder", str(adapted(f, P.BASELINE)), own_head(p, f, P.BASELINE)),
                 Row(f"{f}/{P.PROPOSED}", "xd", f, "encoder", str(adapted(f, P.PROPOSED)))]
    rows += [Row(f"{fam}/{v}", "xd", fam, "encoder", str(adapted(fam, v))) for v in variants if v != CAPTION_CONTROL]
    if CAPTION_CONTROL in variants:
        rows.append(Row(f"{fam}/{CAPTION_CONTROL}", "caption_control", fam, "encoder", str(adapted(fam, CAPTION_CONTROL)),
                        own_head(p, fam, CAPTION_CONTROL)))
    return rows + [Row(CLIP_ROW, "clip", None, "clip", str(PRETRAIN_CLIP)), Row(reference, "reference", None, "hub", reference, "hub")]


def own_head(p: dict, family: str, variant: str) -> str | None:
    """The models/crossmodal folder of `variant`'s MLM head where that head read the encoder's own output (no cross
    layers: the baseline's recipe), else None (no cloze)."""
    from xdbert.adaptation.settings import variant_overrides

    overrides, _ = variant_overrides(p, variant)
    cross_layers = overrides.get("cross_layers", P.get(P.section(p, "adapt"), "cross_layers", "adapt"))
    return str(crossmodal(family, variant)) if cross_layers == 0 else None


def check_inputs(rows: Sequence[Row]) -> None:
    """Every model folder the rows read is there before any work: one PipelineError naming the first missing."""
    for r in rows:
        needed = [] if r.kind == "hub" else [(Path(r.source), CLIP_CONFIG if r.kind == "clip" else "config.json")]
        if r.head not in (None, "hub"):
            needed.append((Path(r.head), CROSSMODAL_CONFIG))
        for folder, marker in needed:
            if not (folder / marker).is_file():
                raise PipelineError(f"missing model folder {folder} (no {marker}) for the probe row `{r.name}`: run the "
                                    f"stage that writes it (`dvc repro`)")
    if not (TOKENIZER / "tokenizer_config.json").is_file():
        raise PipelineError(f"missing {TOKENIZER}: run `dvc repro dual_tokenize`")


# ----------------------------------------------------------------------------------------------------
# Loading a row: its features and, where it has its own MLM head, its cloze
# ----------------------------------------------------------------------------------------------------

class EncoderHead(NamedTuple):
    """An MLM as `vicomte_probe.mask_log_probs` reads it: its encoder, and the head trained on that encoder's output
    (last_hidden_state -> vocabulary logits)."""

    encoder: object
    head: object


class Loaded(NamedTuple):
    """A row's models, loaded: `features(texts)` -> (texts, d); `mlm` and `tokenizer` for the cloze, or None."""

    features: Callable[[Sequence[str]], "object"]
    mlm: EncoderHead | None = None
    tokenizer: object | None = None


def hub_mlm(mlm, name: str) -> EncoderHead:
    """A transformers MLM (`AutoModelForMaskedLM`) as its encoder and the one module beside it, the head its forward
    applies to the encoder's output (BERT's `cls`, RoBERTa's `lm_head`)."""
    heads = [module for module in mlm.children() if module is not mlm.base_model]
    if len(heads) != 1:
        raise PipelineError(f"the probes' reference `{name}` ({type(mlm).__name__}) has {len(heads)} modules beside its "
                            f"encoder; the cloze reads an MLM whose head is one module (BERT, RoBERTa)")
    return EncoderHead(mlm.base_model, heads[0])


def load_row(row: Row) -> Loaded:
    """Row `row`'s models, as the other stages load them (hub ids through their pins: xdbert.hub), on the GPU
    where there is one."""
    from functools import partial

    import torch
    from transformers import AutoModel, AutoModelForMaskedLM

    from xdbert.analysis.vicomte_probe import clip_text_features, mean_token_features
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.hub import hub_request, quiet_loading, source

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if row.kind == "clip":
        from xdbert.clip import clip_tokenizer
        from xdbert.model.saving import load_clip_tower

        tower, cfg = load_clip_tower(row.source)
        return Loaded(partial(clip_text_features, tower.to(device), clip_tokenizer(cfg["clip"]), batch_size=BATCH_SIZE))
    if row.kind == "hub":
        tok = load_encoder_tokenizer(row.source)
        with hub_request(f"the probes' reference encoder `{row.source}`"), quiet_loading():
            mlm = AutoModelForMaskedLM.from_pretrained(source(row.source)).to(device)
        return Loaded(partial(mean_token_features, mlm.base_model, tok, batch_size=BATCH_SIZE), hub_mlm(mlm, row.source), tok)
    tok = load_encoder_tokenizer(str(TOKENIZER))
    if row.head is None:
        with quiet_loading():
            encoder = AutoModel.from_pretrained(row.source).to(device)
        return Loaded(partial(mean_token_features, encoder, tok, batch_size=BATCH_SIZE))
    from xdbert.model.saving import load_full

    full = load_full(row.head, device)  # its encoder is the adapted folder's, with the head it was trained with
    return Loaded(partial(mean_token_features, full.encoder, tok, batch_size=BATCH_SIZE),
                  EncoderHead(full.encoder, full.mlm_head), tok)
