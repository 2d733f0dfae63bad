"""Stage `adapt@<variant>` (and `adapt_baseline`): train the cross-modal ensemble on the token shards.

Writes models/adapted/<variant> (the language encoder alone, a plain `save_pretrained` folder),
models/crossmodal/<variant> (the whole cross-modal model) and metrics/adapt/<variant>.json.
Checkpoints go to checkpoints/adapt/<variant>.pt, outside DVC's outputs, so a killed run resumes.
"""
import sys
from pathlib import Path

from xdbert import io, params
from xdbert.errors import PipelineError
from xdbert.stage import run

LOSSES = ("mlm", "match", "cliptc")


def settings_for(variant: str, p: dict) -> dict:
    """The adapt section with the variant's overrides applied, every value checked."""
    a = params.section(p, "adapt")
    if variant == "baseline":
        overrides = a.get("baseline") or {}
    else:
        variants = a.get("variants") or {}
        params.choice(variant, "`adapt.variants` entry", [*variants, "baseline"])
        overrides = variants[variant] or {}
    unknown = set(overrides) - set(a)
    if unknown:
        raise PipelineError(f"adapt.variants.{variant} overrides unknown keys {sorted(unknown)}; allowed: {sorted(k for k in a if k not in ('variants', 'baseline'))}")
    s = {k: v for k, v in a.items() if k not in ("variants", "baseline")} | overrides
    where = f"adapt.variants.{variant}" if variant != "baseline" else "adapt.baseline"

    def key_of(key: str) -> str:  # name the key the value came from: the variant's override or the default
        return f"{where}.{key}" if key in overrides else f"adapt.{key}"

    params.subset(s["losses"], key_of("losses"), LOSSES)
    params.positive(s["epochs"], key_of("epochs"))
    params.positive(s["lr"], key_of("lr"), float)
    for key in ("batch_size", "micro_batch_size", "checkpoint_every", "eval_windows", "clip_heads"):
        params.positive(s[key], key_of(key))
    if s["cross_layers"] < 0 or (s["cross_layers"] == 0 and s["losses"] != ["mlm"]):
        raise PipelineError(f"`{key_of('cross_layers')}` must be >= 1 (0 only for the MLM-only baseline); got {s['cross_layers']}")
    for key in ("warmup_ratio", "mlm_prob", "match_prob", "cliptc_prob"):
        params.fraction(s[key], key_of(key))
    for key in ("placeholder", "freeze_clip", "mlm_negatives", "compile"):
        params.flag(s[key], key_of(key))
    params.choice(s.get("precision", "auto"), key_of("precision"), ("auto", "bf16", "no"))
    params.choice(s["cliptc_vocab"], key_of("cliptc_vocab"), ("full", "shards"))
    weights = s["loss_weights"]
    if not isinstance(weights, dict) or set(weights) - set(LOSSES):
        raise PipelineError(f"`{key_of('loss_weights')}` must map losses ({', '.join(LOSSES)}) to weights; got {weights!r}")
    for name, w in weights.items():
        params.positive(w, f"{key_of('loss_weights')}.{name}", float)
    if s["init_range"] is not None:
        params.positive(s["init_range"], key_of("init_range"), float)
    return s


def main() -> None:
    if len(sys.argv) != 2:
        raise PipelineError("usage: python stages/adapt.py VARIANT (a key of adapt.variants, or `baseline`)")
    variant = sys.argv[1]
    p = params.load()
    s = settings_for(variant, p)
    m = params.section(p, "model")

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import numpy as np
    import torch
    from dvclive import Live
    from transformers import AutoTokenizer

    from xdbert import modeling, pretraining, shards
    from xdbert.adaptation import AdaptSettings, BatchMaker, adapt
    from xdbert.clip import clip_special_ids

    manifest = shards.read_manifest("data/shards")
    shards.check_matches(manifest, tokenizer_dir="models/tokenizer", clip_name=m["clip"])
    train, valid = shards.open_shards("data/shards", "train"), shards.open_shards("data/shards", "valid")
    tok = AutoTokenizer.from_pretrained("models/tokenizer")
    _, eot = clip_special_ids(m["clip"])

    torch.manual_seed(m["seed"])  # every variant starts from the same initial weights
    config = modeling.XDBertConfig(
        encoder=pretraining.encoder_source(m), encoder_config=m.get("encoder_config") or {}, vocab_size=len(tok),
        clip=m["clip"], clip_pretrained=m["clip_pretrained"], clip_heads=s["clip_heads"],
        clip_blocks=manifest["n_blocks"], cross_layers=s["cross_layers"], losses=s["losses"],
        placeholder=s["placeholder"], clip_eot_id=eot, init_range=s["init_range"])
    model = modeling.XDBertModel.build(config)
    if model.clip is not None:
        # The tower as the `pretrained` stage left it: the downloaded weights (paper profile) or the
        # embedded profile's stand-in, a random tower trained as a causal language model on the corpus.
        tower, saved = modeling.load_clip_tower("models/pretrained/clip")
        if (saved["clip"], saved["clip_pretrained"]) != (m["clip"], m["clip_pretrained"]):
            raise PipelineError(f"models/pretrained/clip holds {saved['clip']} ({saved['clip_pretrained'] or 'random init'}), "
                                f"params ask for {m['clip']} ({m['clip_pretrained'] or 'random init'}): run `dvc repro pretrained`")
        model.clip.load_state_dict(tower.state_dict())
    if s["cliptc_vocab"] == "shards" and model.cliptc_head is not None:
        used = [split[np.arange(len(split))]["clip_ids"] for split in (train, valid)]
        model.restrict_cliptc(torch.from_numpy(np.unique(np.concatenate([np.unique(u) for u in used])).astype(np.int64)))
    if s["freeze_clip"] and model.clip is not None:
        model.clip.requires_grad_(False)

    settings = AdaptSettings(**{k: s[k] for k in AdaptSettings.__dataclass_fields__ if k in s})
    make_batch = BatchMaker(settings, s["losses"], manifest["n_blocks"], vocab_size=len(tok),
                            special_ids=tok.all_special_ids, mask_id=tok.mask_token_id, eot_id=eot)
    checkpoint = Path("checkpoints/adapt") / f"{variant}.pt"
    with Live(dir=f"dvclive/adapt/{variant}", save_dvc_exp=False, dvcyaml=None) as live:
        def log(metrics: dict, step: int) -> None:
            for k, v in metrics.items():
                live.log_metric(k, v, plot=True)
            live.next_step()
        metrics = adapt(model, train, valid, make_batch, settings, checkpoint, log=log)

    modeling.save_adapted(model, Path("models/adapted") / variant, tokenizer_dir="models/tokenizer")
    if variant != "baseline":
        modeling.save_full(model, Path("models/crossmodal") / variant)
    io.write_json(Path("metrics/adapt") / f"{variant}.json", {"variant": variant, "profile": p["profile"], **metrics})
    checkpoint.unlink(missing_ok=True)  # the outputs are complete; the checkpoint has done its job
    print(f"adapt@{variant}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith("valid_")))


if __name__ == "__main__":
    run(main)
