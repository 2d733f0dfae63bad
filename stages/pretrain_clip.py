"""Stage `pretrain_clip`: CLIP's text tower as the adaptation starts from it (and the CLIP-T finetuning row).

    deps:   data/shards (CLIP blocks of the train windows), models/tokenizer (the shards' check)
    outs:   models/pretrain_clip (clip_config.json + model.safetensors), metrics/pretrain_clip.json

Paper profile: open_clip `model.clip` with `model.clip_pretrained` weights (e.g. ViT-B-32 / openai), as
downloaded. Embedded profile (`model.clip_pretrained: ""`): the stand-in for CLIP's pretraining, a random
tower trained `pretrain.clip_steps` steps as a causal language model on the CLIP blocks of the corpus
(xdbert/adaptation/pretraining.py). Checkpoints go to checkpoints/pretrain_clip.pt, so a killed run resumes.
"""
from xdbert import params, paths, runlog
from xdbert.adaptation.settings import PretrainSettings
from xdbert.model.settings import ModelSettings
from xdbert.stage import run


def read(p: dict) -> tuple[str, ModelSettings, PretrainSettings | None]:
    """(profile, model, settings; None: the tower is not trained): every param this stage reads, checked;
    tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    model = ModelSettings.from_params(p)
    return p["profile"], model, PretrainSettings.clip_from_params(p, model.clip_pretrained)


def main() -> None:
    profile, model, settings = read(params.load())

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import torch

    from xdbert.adaptation import pretraining
    from xdbert.clip import clip_special_ids
    from xdbert.data import shards
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.saving import save_clip_tower

    checkpoint = paths.PRETRAIN_CLIP_CHECKPOINT
    torch.manual_seed(model.seed)  # a random tower's initial weights
    tower = CLIPTextTower.build(model.clip, model.clip_pretrained)
    metrics = {"profile": profile, "clip": model.clip, "clip_pretrained": model.clip_pretrained, "steps": 0}
    if settings is not None:
        manifest = shards.read_manifest(paths.SHARDS)
        shards.check_matches(manifest, tokenizer_dir=paths.TOKENIZER, clip_name=model.clip)
        blocks = pretraining.shard_blocks(shards.open_shards(paths.SHARDS, "train", verify=True))
        metrics.update(pretraining.pretrain_clip(tower, blocks, clip_special_ids(model.clip)[1], settings, checkpoint))
    save_clip_tower(tower, paths.PRETRAIN_CLIP, model.clip, model.clip_pretrained)
    runlog.write_metrics(paths.PRETRAIN_CLIP_METRICS, metrics, "pretrain_clip")
    checkpoint.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    how = f"{settings.steps} steps of next-token prediction, accuracy {metrics['first_lm_accuracy']:.3f} -> " \
          f"{metrics['last_lm_accuracy']:.3f}" if settings is not None else (model.clip_pretrained or "random init")
    print(f"pretrain_clip: CLIP text tower {model.clip} ({how}) -> {paths.PRETRAIN_CLIP}")


if __name__ == "__main__":
    run(main)
