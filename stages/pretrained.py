"""Stage `pretrained`: CLIP's text tower as the adaptation starts from it (and the CLIP-T finetuning row).

    params: model.{clip, clip_pretrained, seed}, pretrain.{clip_steps, batch_size, lr, warmup_ratio, weight_decay,
            checkpoint_every, seed}
    deps:   data/shards (CLIP blocks of the train windows), models/tokenizer (the shards' check)
    outs:   models/pretrained/clip (clip_config.json + model.safetensors), metrics/pretrain_clip.json

Paper profile: open_clip `model.clip` with `model.clip_pretrained` weights (e.g. ViT-B-32 / openai), as
downloaded. Embedded profile (`model.clip_pretrained: ""`): the stand-in for CLIP's pretraining, a random
tower trained `pretrain.clip_steps` steps as a causal language model on the CLIP blocks of the corpus
(xdbert/pretraining.py). Checkpoints go to checkpoints/pretrain_clip.pt, so a killed run resumes.
"""
from pathlib import Path

from xdbert import io, params
from xdbert.errors import PipelineError
from xdbert.stage import run

CHECKPOINT = Path("checkpoints/pretrain_clip.pt")


def main() -> None:
    p = params.load()
    m, s = params.section(p, "model"), params.section(p, "pretrain")
    steps = params.get(s, "clip_steps", "pretrain")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise PipelineError(f"`pretrain.clip_steps` must be an integer >= 0 (0 = keep a random CLIP tower random); got {steps!r}")
    train_it = not m["clip_pretrained"] and steps > 0
    if train_it:
        for key in ("batch_size", "checkpoint_every"):
            params.positive(s[key], f"pretrain.{key}")
        params.positive(s["lr"], "pretrain.lr", float)
        for key in ("warmup_ratio", "weight_decay"):
            params.fraction(s[key], f"pretrain.{key}")

    import numpy as np
    import torch

    from xdbert import pretraining, shards
    from xdbert.clip import clip_special_ids
    from xdbert.modeling import CLIPTextTower, save_clip_tower
    from xdbert.tokenization import CLIP_CONTEXT

    torch.manual_seed(m["seed"])  # a random tower's initial weights
    tower = CLIPTextTower.build(m["clip"], m["clip_pretrained"])
    metrics = {"profile": p["profile"], "clip": m["clip"], "clip_pretrained": m["clip_pretrained"], "steps": 0}
    if train_it:
        manifest = shards.read_manifest("data/shards")
        shards.check_matches(manifest, tokenizer_dir="models/tokenizer", clip_name=m["clip"])
        train = shards.open_shards("data/shards", "train")
        blocks = torch.from_numpy(train[np.arange(len(train))]["clip_ids"].astype(np.int64)).view(-1, CLIP_CONTEXT)
        fields = pretraining.PretrainSettings.__dataclass_fields__
        settings = pretraining.PretrainSettings(**{k: s[k] for k in fields if k != "steps"}, steps=steps)
        metrics.update(pretraining.pretrain_clip(tower, blocks, clip_special_ids(m["clip"])[1], settings, CHECKPOINT))
    save_clip_tower(tower, "models/pretrained/clip", m["clip"], m["clip_pretrained"])
    io.write_json("metrics/pretrain_clip.json", metrics)
    CHECKPOINT.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    how = f"{steps} steps of next-token prediction, accuracy {metrics['first_lm_accuracy']:.3f} -> " \
          f"{metrics['last_lm_accuracy']:.3f}" if train_it else (m["clip_pretrained"] or "random init")
    print(f"pretrained: CLIP text tower {m['clip']} ({how}) -> models/pretrained/clip")


if __name__ == "__main__":
    run(main)
