"""The `adapt` section, every value checked once, before anything heavy is imported.

Each check raises `PipelineError` naming the full key and what is allowed. An adaptation variant's value
is named by the key it came from: `adapt.variants.<name>.<key>` for an override, `adapt.<key>` otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.paths import CLIP_TOWERS
from xdbert.model import LOSSES
from xdbert.precisions import PRECISIONS

# `adapt.text`: what the adaptation trains on. corpus: the token shards' windows; captions: the caption
# corpus (data/captions/captions.json) packed into windows of the same length, mixed with corpus windows at
# `mechanism.caption_share` as the CLIP stand-in reads them (xdbert.adaptation.captions), the caption-text
# control: the encoder alone, MLM only; captions_nofacts: the same with the mechanism study's twin captions.
TEXTS = ("corpus", "captions", "captions_nofacts")
CAPTION_TEXTS = TEXTS[1:]

# Every key of the section (a typo among them is refused when a variant's settings are built)
ADAPT_KEYS = ("family", "variants", "baseline", "losses", "cross_layers", "clip_heads", "placeholder", "freeze_clip",
              "mlm_negatives", "clip_tower", "loss_weights", "init_range", "cliptc_vocab", "text", "epochs", "lr",
              "warmup_ratio", "weight_decay", "batch_size", "micro_batch_size", "mlm_prob", "attribute_mlm_prob",
              "match_prob", "cliptc_prob", "checkpoint_every", "eval_windows", "precision", "compile", "seed")


NOT_SETTINGS = ("family", "variants", "baseline")  # keys of the adapt section that name runs, not values


def variant_overrides(params: dict, variant: str) -> tuple[dict, str]:
    """(what variant `variant` changes of the `adapt` defaults, the key that holds it): `xdbert` changes nothing,
    `baseline` is `adapt.baseline`, an ablation a key of `adapt.variants`."""
    a = P.section(params, "adapt", ADAPT_KEYS)
    P.choice(variant, "adaptation variant", [P.PROPOSED, P.BASELINE, *P.variant_names(params)])
    if variant == P.PROPOSED:
        overrides, where = {}, "adapt"
    elif variant == P.BASELINE:
        overrides, where = a.get("baseline"), "adapt.baseline"
    else:
        overrides, where = a["variants"][variant], f"adapt.variants.{variant}"
    overrides = {} if overrides is None else overrides  # `name:` or `name: {}`: the defaults as they are
    if not isinstance(overrides, dict):
        raise PipelineError(f"`{where}` must map adapt keys to the values this variant changes; got {overrides!r}")
    return overrides, where


def setting_key(params: dict, variant: str, key: str) -> str:
    """The full key variant `variant`'s `key` comes from: its own override, or the `adapt` default."""
    return key_in(*variant_overrides(params, variant), key)


def key_in(overrides: dict, where: str, key: str) -> str:
    """`key`'s full name, given a variant's `overrides` and the key `where` they are written."""
    return f"{where}.{key}" if key in overrides else f"adapt.{key}"


@dataclass(frozen=True)
class AdaptSettings:
    """One adaptation variant: the `adapt` defaults with the variant's overrides applied."""

    # The model it trains (`xdbert.model.build`)
    losses: list
    cross_layers: int         # 0 only for the MLM-only baseline
    clip_heads: int           # heads of the CLIP stream in the cross layers
    placeholder: bool         # a learned sequence in place of CLIP's features (control run)
    freeze_clip: bool
    clip_tower: str           # models/<name>, the CLIP stand-in beside the encoder: pretrain_clip, or its nofacts twin
    init_range: float | None  # std of the new modules' init; None = the encoder's initializer_range
    cliptc_vocab: str         # CLIPTC's classes: all CLIP ids (full) or those in the token shards (shards)
    # The training loop (`xdbert.adaptation.loop`)
    text: str                 # what it trains on (TEXTS): the corpus windows, or the captions in windows
    epochs: int               # with `text: captions`, counted in passes over the corpus: the steps a corpus run takes
    lr: float
    warmup_ratio: float
    weight_decay: float
    batch_size: int           # windows per optimizer step
    micro_batch_size: int     # windows per forward pass; gradients accumulate up to batch_size
    mlm_prob: float
    attribute_mlm_prob: float  # the mechanism study's attribute words (`mechanism.patterns`) as MLM targets: each one
                               # with this chance; 0 = like any word (`mlm_prob` of a window's tokens)
    match_prob: float
    cliptc_prob: float
    mlm_negatives: bool       # MLM targets also in MATCH negatives (LXMERT)
    loss_weights: dict | None  # loss name -> weight in the trained sum; None or an absent name = 1 (the paper)
    checkpoint_every: int
    eval_windows: int
    precision: str            # auto | bf16 | fp16 | no (xdbert.training.mixed_precision)
    compile: bool | str       # torch.compile the model for the training steps: true, false, auto (on a GPU)
    seed: int

    @classmethod
    def from_params(cls, params: dict, variant: str) -> "AdaptSettings":
        """Variant `variant`, every value checked: `xdbert` (the proposed setting: the defaults as they are),
        `baseline` (`adapt.baseline`) or an ablation (a key of `adapt.variants`)."""
        a = P.section(params, "adapt")
        overrides, where = variant_overrides(params, variant)
        unknown = set(overrides) - (set(a) - set(NOT_SETTINGS))
        if unknown:
            raise PipelineError(f"{where} overrides unknown keys {sorted(unknown, key=str)}; allowed: {sorted(k for k in a if k not in NOT_SETTINGS)}")
        # the defaults a variant does not override, then its overrides: a default it overrides is never read
        s = {k: a[k] for k in a if k not in NOT_SETTINGS and k not in overrides} | overrides

        def key_of(key: str) -> str:  # name the key the value came from: the variant's override or the default
            return key_in(overrides, where, key)

        missing = [f.name for f in fields(cls) if f.name not in s]
        if missing:
            raise PipelineError(f"missing param `adapt.{missing[0]}`")
        P.subset(s["losses"], key_of("losses"), LOSSES)
        if len(set(s["losses"])) != len(s["losses"]):
            raise PipelineError(f"`{key_of('losses')}` lists a loss twice: {s['losses']}")
        # integers as integers: `epochs: 2.0` passes the check, and the loop counts with what is stored
        for key in ("epochs", "batch_size", "micro_batch_size", "checkpoint_every", "eval_windows", "clip_heads"):
            s[key] = P.positive(s[key], key_of(key))
        if s["micro_batch_size"] > s["batch_size"]:
            raise PipelineError(f"`{key_of('micro_batch_size')}` ({s['micro_batch_size']}) must be at most `{key_of('batch_size')}` "
                                f"({s['batch_size']}): a forward pass holds a share of one optimizer step's windows")
        if "match" in s["losses"] and s["micro_batch_size"] < 2:
            raise PipelineError(f"`{key_of('micro_batch_size')}` must be at least 2 while `{key_of('losses')}` has match: a "
                                f"window's MATCH negative is the CLIP text of another window of its forward pass")
        P.positive(s["lr"], key_of("lr"), float)
        for key in ("placeholder", "freeze_clip", "mlm_negatives"):
            P.flag(s[key], key_of(key))
        P.compile_setting(s["compile"], key_of("compile"))
        P.choice(s["clip_tower"], key_of("clip_tower"), CLIP_TOWERS)
        cross = s["cross_layers"]
        if not isinstance(cross, int) or isinstance(cross, bool) or cross < 0:
            raise PipelineError(f"`{key_of('cross_layers')}` must be an integer >= 0 (0: the MLM-only baseline); got {cross!r}")
        P.choice(s["text"], key_of("text"), TEXTS)
        if s["text"] in CAPTION_TEXTS and (cross != 0 or s["losses"] != ["mlm"]):
            # the caption windows' CLIP blocks are never fed: the control is the baseline's recipe on other text
            raise PipelineError(f"`{key_of('text')}: {s['text']}` trains the encoder alone with MLM on caption windows, "
                                f"which give no CLIP text to cross layers, MATCH or CLIPTC: it needs "
                                f"`{key_of('cross_layers')}: 0` and `{key_of('losses')}: [mlm]`; got cross_layers {cross}, "
                                f"losses {s['losses']}")
        if cross == 0 and (set(s["losses"]) - {"distill", "kl"} != {"mlm"} or s["placeholder"]):
            raise PipelineError(f"`{key_of('cross_layers')}: 0` (the MLM-only baseline, or it with an encoder-side "
                                f"control) allows only `{key_of('losses')}: [mlm]` with distill or kl besides, without "
                                f"placeholder; got losses {s['losses']}, placeholder {s['placeholder']}")
        if "kl" in s["losses"] and ("mlm" not in s["losses"] or s["placeholder"]):
            raise PipelineError(f"`{key_of('losses')}` has kl, which pulls the MLM head towards CLIP's tower: it needs mlm "
                                f"and no placeholder; got losses {s['losses']}, `{key_of('placeholder')}: {s['placeholder']}`")
        if s["placeholder"] and "distill" in s["losses"]:
            raise PipelineError(f"`{key_of('placeholder')}: true` has no CLIP tower whose states distill could target; "
                                f"use `losses: [mlm]` (got `{key_of('losses')}: {s['losses']}`)")
        if s["placeholder"] and set(s["losses"]) & {"match", "cliptc"}:
            # as the model refuses it (XDBertConfig.validate), but before the heavy imports
            raise PipelineError(f"`{key_of('placeholder')}: true` replaces the CLIP text, so losses match and cliptc are impossible; "
                                f"use `losses: [mlm]` (got `{key_of('losses')}: {s['losses']}`)")
        for key in ("warmup_ratio", "weight_decay", "mlm_prob", "attribute_mlm_prob", "match_prob", "cliptc_prob"):
            P.fraction(s[key], key_of(key))
        for loss in s["losses"]:  # a loss in use needs targets of both kinds: MATCH's pairs, masked tokens
            if loss in ("distill", "kl"):  # no share drawn: distill's are aligned tokens, kl's a subset of MLM's
                continue
            key, prob = f"{loss}_prob", s[f"{loss}_prob"]
            if prob == 0 or (loss == "match" and prob == 1):
                raise PipelineError(f"`{key_of(key)}` must be above 0{' and below 1' if loss == 'match' else ''} while "
                                    f"`{key_of('losses')}` has {loss}: at {prob!r} it has nothing to learn")
        P.choice(s["precision"], key_of("precision"), PRECISIONS)
        P.choice(s["cliptc_vocab"], key_of("cliptc_vocab"), ("full", "shards"))
        weights = s["loss_weights"]
        if weights is not None:  # None: every loss weighs 1 (the paper)
            if not isinstance(weights, dict):
                raise PipelineError(f"`{key_of('loss_weights')}` must map losses ({', '.join(LOSSES)}) to weights; got {weights!r}")
            unknown = sorted(map(str, set(weights) - set(LOSSES)))
            if unknown:
                raise PipelineError(f"`{key_of('loss_weights')}` names {', '.join(unknown)}, which is not a loss; allowed: "
                                    f"{', '.join(LOSSES)}")
            for name, w in weights.items():
                P.positive(w, f"{key_of('loss_weights')}.{name}", float)
        if "distill" in s["losses"] and "distill" not in (weights or {}):
            # Named where it is used, not in the defaults: a default weight would change every stage's params.
            # No paper sets it, and a cosine distance has no scale in common with the cross-entropies.
            raise PipelineError(f"`{key_of('loss_weights')}` must give distill a weight while `{key_of('losses')}` has "
                                f"distill; got {weights!r}")
        if s["init_range"] is not None:
            P.positive(s["init_range"], key_of("init_range"), float)
        P.non_negative(s["seed"], key_of("seed"))
        return cls(**{f.name: s[f.name] for f in fields(cls)})
