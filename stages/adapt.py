"""Stages `adapt@<family>`, `adapt_baseline@<family>` and `ablate@<variant>`: train the cross-modal ensemble
of one encoder family on the token shards.

    python stages/adapt.py FAMILY VARIANT

VARIANT is `xdbert` (the proposed setting, every family), `baseline` (MLM only, every family) or a key of
`adapt.variants` (Table 3's ablations, on `adapt.family` only). Writes models/adapted/<family>/<variant>
(the language encoder alone, a plain `save_pretrained` folder), models/crossmodal/<family>/<variant> (the
whole model: for the baseline, its encoder and the MLM head trained on it, which the probes' cloze reads) and
metrics/adapt/<family>/<variant>.json (the
held-out metrics, and the parameters of each part of the model it built: Table 6's counts).
A variant with `text: captions` (the caption-text control, `caption_mlm`) trains on data/captions/captions.json
packed into windows of the shards' length (xdbert.adaptation.captions) for the steps the corpus windows give
(`loop.total_steps`), and is scored on the corpus's held-out windows as every variant is.
Checkpoints go to checkpoints/adapt/<family>/<variant>.pt, outside DVC's outputs, so a killed run resumes.
On a machine with several GPUs it runs once per GPU (xdbert.adaptation.launch); the main process
alone writes the outputs and removes the checkpoint.
"""
import contextlib
import subprocess
import sys
from typing import NamedTuple

from xdbert import io, params, paths, runlog
from xdbert.adaptation.settings import CAPTION_TEXTS, AdaptSettings, setting_key
from xdbert.data.caption_mix import attribute_words, caption_share
from xdbert.errors import PipelineError
from xdbert.model.families import ablation_family
from xdbert.model.settings import ModelSettings
from xdbert.stage import run


class Plan(NamedTuple):
    """What `read` checked."""

    profile: str
    model: ModelSettings
    settings: AdaptSettings
    keys: dict[str, str]             # the full keys `clip_heads`, `text`, `attribute_mlm_prob` come from, for errors
    caption_share: float | None      # the caption control's share of caption windows (None: it reads the corpus)
    attributes: tuple[str, ...]      # the words `attribute_mlm_prob` masks (none where it is 0)


def read(p: dict, family: str, variant: str) -> Plan:
    """Every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    model = ModelSettings.from_params(p, family)
    settings = AdaptSettings.from_params(p, variant)
    ablated = ablation_family(p).name
    if variant not in (params.PROPOSED, params.BASELINE) and family != ablated:
        raise PipelineError(f"the ablation variant {variant!r} is adapted on `adapt.family` ({ablated}) only; "
                            f"family {family!r} has {params.PROPOSED} and {params.BASELINE}")
    keys = {key: setting_key(p, variant, key) for key in ("clip_heads", "text", "attribute_mlm_prob")}
    mix = caption_share(p) if settings.text in CAPTION_TEXTS else None
    attributes = attribute_words(p) if settings.attribute_mlm_prob > 0 else ()
    if settings.attribute_mlm_prob > 0 and not attributes:
        raise PipelineError(f"`{keys['attribute_mlm_prob']}` is {settings.attribute_mlm_prob}, but `mechanism.patterns` "
                            f"names no attribute words to mask: set it to 0, or list the words")
    return Plan(p["profile"], model, settings, keys, mix, attributes)


def main() -> None:
    if len(sys.argv) != 3:
        raise PipelineError("usage: python stages/adapt.py FAMILY VARIANT (a key of `families`; xdbert, baseline or a "
                            "key of adapt.variants)")
    family, variant = sys.argv[1:]
    plan = read(params.load(), family, variant)
    profile, model, settings, keys = plan.profile, plan.model, plan.settings, plan.keys
    name = f"{family}/{variant}"
    stage = {params.PROPOSED: f"adapt@{family}", params.BASELINE: f"adapt_baseline@{family}"}.get(variant, f"ablate@{variant}")

    from xdbert.data import shards

    manifest = shards.read_manifest(paths.SHARDS)
    caption_file = {"captions": paths.CAPTIONS_JSON, "captions_nofacts": paths.CAPTIONS_NOFACTS_JSON}.get(settings.text)
    if caption_file is not None and not caption_file.is_file():
        raise PipelineError(f"missing {caption_file}, the captions `{keys['text']}: {settings.text}` trains on: run "
                            f"`dvc repro captions`")
    # Heavy imports after the params and the manifest are known to be good: a typo or a missing input
    # fails in a second.
    import torch

    from xdbert.adaptation.launch import launch_command

    command = launch_command(sys.argv, torch.cuda.device_count())
    if command:
        print(f"{stage}: one process per GPU: {' '.join(command)}", flush=True)
        raise SystemExit(subprocess.call(command))

    from accelerate import PartialState
    from dvclive import Live
    from transformers import AutoTokenizer

    from xdbert.adaptation.captions import caption_windows, with_corpus
    from xdbert.adaptation.loop import BatchMaker, adapt, total_steps
    from xdbert.clip import clip_special_ids
    from xdbert.data.provided import read_coco_captions
    from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
    from xdbert.data.tokenization.vocab import check_shared_vocabulary
    from xdbert.data.tokenization.word_ids import shared_single_ids, single_ids
    from xdbert.model import controls
    from xdbert.model.build import build_xdbert, check_clip_heads, shard_clip_ids
    from xdbert.model.modeling import PARTS, count_parameters
    from xdbert.model.saving import save_adapted, save_full

    try:  # the tower's width is open_clip's to tell: here, before the shards are read
        check_clip_heads(model.clip, settings.clip_heads)
    except ValueError as e:
        raise PipelineError(f"`{keys['clip_heads']}` = {e}") from None
    shards.check_matches(manifest, tokenizer_dir=paths.TOKENIZER, clip_name=model.clip)
    check_shared_vocabulary(model.encoder, family, paths.TOKENIZER)
    # verify: a flipped byte inside a shard still reads as Arrow; only its sha256 tells
    train, valid = (shards.open_shards(paths.SHARDS, split, verify=True) for split in ("train", "valid"))
    tok = AutoTokenizer.from_pretrained(str(paths.TOKENIZER))
    _, eot = clip_special_ids(model.clip)
    steps = total_steps(len(train), settings)  # the corpus's: the caption control takes as many over its windows
    windows = train
    if caption_file is not None:
        captions = caption_windows(read_coco_captions(caption_file), manifest, tok.backend_tokenizer.to_str(),
                                   clip_fast_tokenizer(model.clip).to_str())
        windows = with_corpus(captions, train, plan.caption_share)
        print(f"{stage}: {len(captions):,} caption windows from {caption_file} and {len(windows) - len(captions):,} "
              f"corpus windows, {steps} steps ({steps * settings.batch_size / len(windows):.2f} passes)", flush=True)
    try:
        attribute_ids = single_ids(tok, plan.attributes, "attribute word")
    except ValueError as e:
        raise PipelineError(f"`{keys['attribute_mlm_prob']}`: {e}") from None

    xdbert = build_xdbert(model, settings, vocab_size=len(tok), clip_blocks=manifest["n_blocks"], clip_eot_id=eot,
                          splits=(train, valid), clip_tower=paths.MODELS / settings.clip_tower)
    kl = {}
    if "kl" in settings.losses:  # rung T: the words each vocabulary has as one token, that the tower learned to predict
        encoder_ids, clip_ids = shared_single_ids(tok, clip_fast_tokenizer(model.clip), shard_clip_ids((train,)).tolist())
        controls.restrict_kl(xdbert, torch.tensor(encoder_ids), torch.tensor(clip_ids))
        kl = {"kl_ids": encoder_ids}
        print(f"{stage}: kl over {len(encoder_ids):,} words that are one token in both vocabularies", flush=True)
    make_batch = BatchMaker(settings, manifest["n_blocks"], attribute_ids, vocab_size=len(tok),
                            special_ids=tok.all_special_ids, mask_id=tok.mask_token_id, eot_id=eot, **kl)
    checkpoint = paths.adapt_checkpoint(family, variant)
    # The plots (a DVC output) are written aside and renamed when training ends: a run that fails
    # (a damaged checkpoint, a full disk) leaves the last complete plots, and a resumed run replays its
    # earlier steps into them (xdbert.adaptation.loop).
    # as the loop's Accelerator will see it: on a CPU, several launched processes join over gloo
    main_process = PartialState(cpu=not torch.cuda.is_available()).is_main_process
    with contextlib.ExitStack() as outputs:
        live = None
        if main_process:
            plots = outputs.enter_context(io.atomic_path(paths.ADAPT_PLOTS / name, is_dir=True))
            live = outputs.enter_context(Live(dir=str(plots), save_dvc_exp=False, dvcyaml=None))

        # No `live.next_step()`: in dvclive 3.49 it re-reads every plot TSV for Studio at each step, a cost
        # that grows with the square of the steps (a third of a caption reference's time). `log_metric`
        # appends the TSV rows, and leaving the `Live` block writes the summary, the same bytes either way.
        def log(metrics: dict, step: int) -> None:
            live.step = step  # the loop's own count, also when a resumed run replays the steps it took before
            for k, v in metrics.items():
                live.log_metric(k, v, plot=True)
        metrics = adapt(xdbert, windows, valid, make_batch, settings, checkpoint, log=log if live else None, steps=steps)
    if not main_process:
        return

    save_adapted(xdbert, paths.adapted(family, variant), tokenizer_dir=paths.TOKENIZER)
    save_full(xdbert, paths.crossmodal(family, variant))
    runlog.write_metrics(paths.ADAPT_METRICS / family / f"{variant}.json",
                         {"family": family, "variant": variant, "encoder": model.encoder, "profile": profile,
                          "mlm_head": xdbert.mlm_head_source, "text": settings.text, "train_windows": len(windows),
                          **metrics,
                          "parameters": {part: count_parameters(xdbert, part) for part in PARTS}}, stage)
    checkpoint.unlink(missing_ok=True)  # the outputs are complete; the checkpoint has done its job
    print(f"{stage}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith("valid_")))


if __name__ == "__main__":
    run(main, takes_arguments=True)
