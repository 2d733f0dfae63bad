"""Stage `pretrain_encoder`: the embedded profile's stand-in for a pretrained language encoder.

    params: model, pretrain
    deps:   data/corpus (train sentences), models/tokenizer
    outs:   models/pretrain_encoder (a `...ForMaskedLM` save_pretrained folder with its tokenizer),
            metrics/pretrain_encoder.json

A `random:<type>` encoder is built from `model.encoder_config` (seed `model.seed`) and trained with MLM on
restated sentence pairs (xdbert/adaptation/pretraining.py); adaptation, the baseline, CLIP-T and PWCCA then
start from it. A hub encoder (the paper profile) is already pretrained: the folder only records that it is
used as downloaded. Checkpoints go to checkpoints/pretrain_encoder.pt, so a killed run resumes.
"""
from xdbert import io, params, paths, runlog
from xdbert.adaptation.settings import PretrainSettings
from xdbert.model.settings import ModelSettings
from xdbert.stage import run


def main() -> None:
    p = params.load()
    model = ModelSettings.from_params(p)
    settings = PretrainSettings.from_params(p)

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import torch
    from transformers import AutoTokenizer

    from xdbert.adaptation import pretraining
    from xdbert.model.encoders import RANDOM_PREFIX, build_masked_lm

    out = paths.PRETRAIN_ENCODER
    if not model.encoder.startswith(RANDOM_PREFIX):
        with io.atomic_path(out, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "README.md").write_text(f"`model.encoder: {model.encoder}` is pretrained already: stages load it as downloaded.\n")
        runlog.write_metrics(paths.PRETRAIN_ENCODER_METRICS, {"profile": p["profile"], "encoder": model.encoder, "steps": 0},
                             "pretrain_encoder")
        print(f"pretrain_encoder: {model.encoder} is used as downloaded")
        return

    checkpoint = paths.CHECKPOINTS / "pretrain_encoder.pt"
    tokenizer = AutoTokenizer.from_pretrained(str(paths.TOKENIZER))
    sentences = pretraining.corpus_sentences(paths.CORPUS)
    torch.manual_seed(model.seed)
    mlm = build_masked_lm(model.encoder, model.encoder_config, vocab_size=len(tokenizer))
    metrics = pretraining.pretrain(mlm, tokenizer, sentences, settings, checkpoint)

    with io.atomic_path(out, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        mlm.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    runlog.write_metrics(paths.PRETRAIN_ENCODER_METRICS, {"profile": p["profile"], "encoder": model.encoder,
                                                          "sentences": len(sentences), **metrics}, "pretrain_encoder")
    checkpoint.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    print(f"pretrain_encoder: {metrics['steps']} steps, MLM accuracy {metrics['first_mlm_accuracy']:.3f} -> "
          f"{metrics['last_mlm_accuracy']:.3f} -> {out}")


if __name__ == "__main__":
    run(main)
