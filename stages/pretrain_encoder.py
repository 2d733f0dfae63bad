"""Stage `pretrain_encoder@<family>`: the embedded profile's stand-in for a family's pretrained encoder.

    python stages/pretrain_encoder.py FAMILY
    deps:   data/corpus (train sentences), models/tokenizer
    outs:   models/pretrain_encoder/<family> (a `...ForMaskedLM` save_pretrained folder with its tokenizer),
            metrics/pretrain_encoder/<family>.json

A `random:<type>` encoder is built from the family's encoder config (seed `model.seed`) and trained with
MLM on restated sentence pairs (xdbert/adaptation/pretraining.py); the family's adaptations and PWCCA then
start from it. A hub encoder (the paper profile) is already pretrained: the folder only records that it is
used as downloaded. Checkpoints go to checkpoints/pretrain_encoder/<family>.pt, so a killed run resumes.
"""
import sys

from xdbert import io, params, paths, runlog
from xdbert.adaptation.pretrain_settings import PretrainSettings
from xdbert.errors import PipelineError
from xdbert.model.settings import ModelSettings
from xdbert.stage import run


def read(p: dict, family: str) -> tuple[str, ModelSettings, PretrainSettings]:
    """(profile, model, settings): every param this stage reads, checked; tools/dvc_yaml.py records them for its
    `params:` in dvc.yaml."""
    return p["profile"], ModelSettings.from_params(p, family), PretrainSettings.from_params(p)


def main() -> None:
    if len(sys.argv) != 2:
        raise PipelineError("usage: python stages/pretrain_encoder.py FAMILY (a key of `families`)")
    family = sys.argv[1]
    profile, model, settings = read(params.load(), family)

    # Heavy imports after the params are known to be good: a typo fails in a second.
    import torch
    from transformers import AutoTokenizer

    from xdbert.adaptation import pretraining
    from xdbert.data.tokenization.vocab import check_positions, check_tokenizer_folder, encoder_positions
    from xdbert.model.encoders import build_masked_lm
    from xdbert.random_encoder import RANDOM_PREFIX

    # A hub id's config comes from the cache or the hub: a misspelled or missing encoder fails here, before
    # the stage's folder is replaced, not at `adapt`.
    positions = encoder_positions(model.encoder, model.encoder_config)
    out, metrics_file = paths.pretrain_encoder(family), paths.PRETRAIN_ENCODER_METRICS / f"{family}.json"
    if not model.encoder.startswith(RANDOM_PREFIX):
        with io.atomic_path(out, is_dir=True) as tmp:
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "README.md").write_text(f"The encoder `{model.encoder}` is pretrained already: stages load it as downloaded.\n")
        runlog.write_metrics(metrics_file, {"profile": profile, "family": family, "encoder": model.encoder, "steps": 0},
                             f"pretrain_encoder@{family}")
        print(f"pretrain_encoder@{family}: {model.encoder} is used as downloaded")
        return

    check_positions("pretrain.max_len", settings.max_len, positions, model.encoder)
    checkpoint = paths.pretrain_encoder_checkpoint(family)
    check_tokenizer_folder(paths.TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(str(paths.TOKENIZER))
    sentences = pretraining.corpus_sentences(paths.CORPUS)
    torch.manual_seed(model.seed)
    mlm = build_masked_lm(model.encoder, model.encoder_config, vocab_size=len(tokenizer))
    metrics = pretraining.pretrain(mlm, tokenizer, sentences, settings, checkpoint)

    pretraining.save_masked_lm(mlm, tokenizer, out)
    runlog.write_metrics(metrics_file, {"profile": profile, "family": family, "encoder": model.encoder,
                                        "sentences": len(sentences), **metrics}, f"pretrain_encoder@{family}")
    checkpoint.unlink(missing_ok=True)  # the output is complete; the checkpoint has done its job
    print(f"pretrain_encoder@{family}: {metrics['steps']} steps, MLM accuracy {metrics['first_mlm_accuracy']:.3f} -> "
          f"{metrics['last_mlm_accuracy']:.3f} -> {out}")


if __name__ == "__main__":
    run(main, takes_arguments=True)
