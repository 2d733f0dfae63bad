"""Stage `pretrain_encoder`: the embedded profile's stand-in for a pretrained language encoder.

    params: model, pretrain
    deps:   data/corpus (train sentences), models/tokenizer
    outs:   models/pretrained/encoder (a `...ForMaskedLM` save_pretrained folder with its tokenizer),
            metrics/pretrain_encoder.json

A `random:<type>` encoder is built from `model.encoder_config` (seed `model.seed`) and trained with MLM on
restated sentence pairs (xdbert/pretraining.py); adaptation, the baseline, CLIP-T and PWCCA then start from
it. A hub encoder (the paper profile) is already pretrained: the folder only records that it is used as
downloaded. Checkpoints go to checkpoints/pretrain_encoder.pt, so a killed run resumes.
"""
from pathlib import Path

from xdbert import io, params
from xdbert.stage import run

CHECKPOINT = Path("checkpoints/pretrain_encoder.pt")


def main() -> None:
    p = params.load()
    m, s = params.section(p, "model"), params.section(p, "pretrain")
    for key in ("steps", "batch_size", "max_len", "checkpoint_every"):
        params.positive(s[key], f"pretrain.{key}")
    params.positive(s["lr"], "pretrain.lr", float)
    for key in ("mlm_prob", "restate_mask_prob", "warmup_ratio", "weight_decay"):
        params.fraction(s[key], f"pretrain.{key}")

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import pandas as pd
    import torch
    from transformers import AutoTokenizer

    from xdbert import pretraining
    from xdbert.modeling import RANDOM_PREFIX, build_masked_lm

    out = Path(pretraining.OUTPUT_DIR)
    if not m["encoder"].startswith(RANDOM_PREFIX):
        with io.atomic_path(out, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "README.md").write_text(f"`model.encoder: {m['encoder']}` is pretrained already: stages load it as downloaded.\n")
        io.write_json("metrics/pretrain_encoder.json", {"profile": p["profile"], "encoder": m["encoder"], "steps": 0})
        print(f"pretrain_encoder: {m['encoder']} is used as downloaded")
        return

    tokenizer = AutoTokenizer.from_pretrained("models/tokenizer")
    sentences = pretraining.split_sentences(pd.read_parquet("data/corpus/train.parquet")["text"].tolist())
    torch.manual_seed(m["seed"])
    model = build_masked_lm(m["encoder"], m.get("encoder_config"), vocab_size=len(tokenizer))
    settings = pretraining.PretrainSettings(**{k: s[k] for k in pretraining.PretrainSettings.__dataclass_fields__})
    metrics = pretraining.pretrain(model, tokenizer, sentences, settings, CHECKPOINT)

    with io.atomic_path(out, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    io.write_json("metrics/pretrain_encoder.json", {"profile": p["profile"], "encoder": m["encoder"],
                                                    "sentences": len(sentences), **metrics})
    CHECKPOINT.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    print(f"pretrain_encoder: {metrics['steps']} steps, MLM accuracy {metrics['first_mlm_accuracy']:.3f} -> "
          f"{metrics['last_mlm_accuracy']:.3f} -> {out}")


if __name__ == "__main__":
    run(main)
