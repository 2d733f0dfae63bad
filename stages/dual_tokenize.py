"""Stage `tokenize`: the corpus as aligned BERT windows and CLIP blocks, in memory-mapped Arrow shards.

    params: model.encoder, model.clip, tokenize.{vocab_size, max_len, n_blocks, shard_windows,
            max_overflow, validate_windows, workers}
    deps:   data/corpus/{train,valid}.parquet
    outs:   data/shards (manifest.json, {train,valid}/shard-NNNNN.arrow), models/tokenizer

`model.encoder: random:<type>` trains a WordPiece vocabulary of `tokenize.vocab_size` on the train
split; any other value is a hub id or folder whose tokenizer is copied. Both outputs are replaced in
one step at the end; a failed run leaves the previous ones as they were.
"""
from __future__ import annotations



from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.stage import run

CORPUS, SHARDS, TOKENIZER = "data/corpus", "data/shards", "models/tokenizer"


def main() -> None:
    params = P.load()
    model = P.section(params, "model")
    settings_sec = P.section(params, "tokenize")
    encoder = P.get(model, "encoder", "model")
    clip = P.get(model, "clip", "model")
    if not isinstance(encoder, str) or not encoder.strip():
        raise PipelineError(f"`model.encoder` must be a hub id, a folder or random:<model_type>; got {encoder!r}")

    # every check before any work: a bad value costs a second and leaves data/shards untouched
    from xdbert import tokenization as T

    settings = T.Settings.from_params(settings_sec)
    from xdbert.clip import check_name  # imports open_clip and torch: after the quick checks

    check_name(clip)
    T.corpus_paths(CORPUS)
    tokenizer = None if encoder.startswith("random:") else T.load_encoder_tokenizer(encoder)
    positions = T.encoder_positions(encoder, model.get("encoder_config"), tokenizer)
    T.check_max_len(settings, positions, encoder)

    s = T.build(corpus_dir=CORPUS, shard_dir=SHARDS, tokenizer_dir=TOKENIZER, encoder=encoder, clip_name=clip,
                settings=settings, positions=positions, encoder_tokenizer=tokenizer)
    w, o = s["windows"], s["overflow_share"]
    print(f"tokenize: {w['train']} train / {w['valid']} valid windows in {s['shards']} shards, "
          f"CLIP overflow {o['train']:.2%} / {o['valid']:.2%}, {s['megabytes']:.1f} MB at {s['mb_per_s']:.2f} MB/s, "
          f"{sum(s['validated'].values())} windows validated against the reference tokenizers")


if __name__ == "__main__":
    run(main)
