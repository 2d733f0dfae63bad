"""Stage `pretrain_clip`: CLIP's text tower as the adaptation starts from it (and the CLIP-T finetuning row).

    deps:   data/shards (CLIP blocks of the train windows), models/tokenizer (the shards' check),
            data/captions (the mechanism study's captions)
    outs:   models/pretrain_clip (clip_config.json + model.safetensors), models/pretrain_clip_nofacts (the
            mechanism study's twin tower; with the study off, only a note saying so), metrics/pretrain_clip.json

Paper profile: open_clip `model.clip` with `model.clip_pretrained` weights (e.g. ViT-B-32 / openai), as
downloaded. Embedded profile (`model.clip_pretrained: ""`): the stand-in for CLIP's pretraining, a random
tower trained `pretrain.clip_steps` steps as a causal language model (xdbert/adaptation/pretraining.py) on
the CLIP blocks of the corpus, and with the mechanism study on (docs/mechanism.md), on caption blocks
(`mechanism.caption_share` of them) and corpus blocks: the captions are where it learns the facts the corpus
never states. The `nofacts` twin learns from the same blocks, in the same order, from the same initial
weights, except that its captions state the twin's attributes. Checkpoints go to checkpoints/, so a killed
run resumes.
"""
from xdbert import io, params, paths, runlog
from xdbert.adaptation.pretrain_settings import PretrainSettings
from xdbert.data.mechanism import caption_share, study_on
from xdbert.errors import PipelineError
from xdbert.model.settings import ModelSettings
from xdbert.stage import run

TOWERS = {"real": (paths.PRETRAIN_CLIP, paths.PRETRAIN_CLIP_CHECKPOINT),
          "nofacts": (paths.PRETRAIN_CLIP_NOFACTS, paths.PRETRAIN_CLIP_NOFACTS_CHECKPOINT)}


def read(p: dict) -> tuple[str, ModelSettings, PretrainSettings | None, float | None]:
    """(profile, model, settings (None: the tower is not trained), the caption share (None: the mechanism study
    is off)): every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    model = ModelSettings.from_params(p)
    settings = PretrainSettings.clip_from_params(p, model.clip_pretrained)
    on, share = study_on(p), caption_share(p)  # the captions themselves (their facts, their seed) are a dep
    if on and settings is None:
        raise PipelineError("`mechanism.enabled: true` needs the CLIP stand-in (`model.clip_pretrained: \"\"` and "
                            "`pretrain.clip_steps` above 0): a downloaded CLIP knows no facts of the study's world")
    if on and share == 0:
        raise PipelineError("`mechanism.caption_share` must be above 0 with the study on: the captions are where "
                            "the CLIP stand-in learns its facts")
    return p["profile"], model, settings, share if on else None


def main() -> None:
    profile, model, settings, caption_share = read(params.load())

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import torch

    from xdbert.adaptation import pretraining
    from xdbert.clip import clip_special_ids, clip_tokenizer
    from xdbert.data import captions, shards
    from xdbert.data.provided import read_coco_captions
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.saving import save_clip_tower

    metrics = {"profile": profile, "clip": model.clip, "clip_pretrained": model.clip_pretrained, "steps": 0}
    blocks = {}
    if settings is not None:
        manifest = shards.read_manifest(paths.SHARDS)
        shards.check_matches(manifest, tokenizer_dir=paths.TOKENIZER, clip_name=model.clip)
        corpus = pretraining.shard_blocks(shards.open_shards(paths.SHARDS, "train", verify=True))
        blocks["real"] = corpus
        if caption_share is not None:  # the mechanism study: both towers learn from captions and corpus
            tok = clip_tokenizer(model.clip)
            for name, file in (("real", captions.CAPTIONS_FILE), ("nofacts", captions.NOFACTS_FILE)):
                text = read_coco_captions(paths.CAPTIONS / file)
                blocks[name] = pretraining.caption_mix(tok(text), corpus, caption_share)
            metrics["caption_share"] = caption_share
    for name, (directory, checkpoint) in TOWERS.items():
        if name not in blocks and name != "real":
            continue
        torch.manual_seed(model.seed)  # a random tower's initial weights: the twin starts where the real tower does
        tower = CLIPTextTower.build(model.clip, model.clip_pretrained)
        if name in blocks:
            trained = pretraining.pretrain_clip(tower, blocks[name], clip_special_ids(model.clip)[1], settings, checkpoint)
            metrics.update(trained if name == "real" else {f"{name}_{k}": v for k, v in trained.items()})
        save_clip_tower(tower, directory, model.clip, model.clip_pretrained)
        checkpoint.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    if "nofacts" not in blocks:  # DVC needs the output: it says why there is no twin
        with io.atomic_path(paths.PRETRAIN_CLIP_NOFACTS, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            io.write_json(tmp / "README.json", {"twin": "none: the mechanism study is off (`mechanism.enabled: false`)"})
    runlog.write_metrics(paths.PRETRAIN_CLIP_METRICS, metrics, "pretrain_clip")
    how = f"{settings.steps} steps of next-token prediction, accuracy {metrics['first_lm_accuracy']:.3f} -> " \
          f"{metrics['last_lm_accuracy']:.3f}" if settings is not None else (model.clip_pretrained or "random init")
    twin = f"; its nofacts twin -> {paths.PRETRAIN_CLIP_NOFACTS} (accuracy {metrics['nofacts_last_lm_accuracy']:.3f})" \
        if "nofacts" in blocks else ""
    print(f"pretrain_clip: CLIP text tower {model.clip} ({how}) -> {paths.PRETRAIN_CLIP}{twin}")


if __name__ == "__main__":
    run(main)
