"""Stage `dual_tokenize`: the corpus as aligned BERT windows and CLIP blocks, in memory-mapped Arrow shards.

    deps:   data/corpus/{train,valid}.parquet
    outs:   data/shards (manifest.json, {train,valid}/shard-NNNNN.arrow), models/tokenizer

`model.encoder: random:<type>` trains a WordPiece vocabulary of `tokenize.vocab_size` on the train
split; any other value is a hub id or folder whose tokenizer is copied. Both outputs are replaced in
one step at the end; a failed run leaves the previous ones as they were.
"""
from __future__ import annotations

from xdbert import params as P
from xdbert import runlog
from xdbert.paths import CORPUS, SHARDS, TOKENIZER
from xdbert.stage import run


def read(p: dict) -> tuple:
    """Every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    from xdbert.data.tokenization.build import Inputs

    return Inputs.read(p)


def main() -> None:
    from xdbert.data.tokenization.build import Inputs, build

    inputs = Inputs.check(*read(P.load()), CORPUS)  # every check before any work: data/shards stays untouched
    s = build(corpus_dir=CORPUS, shard_dir=SHARDS, tokenizer_dir=TOKENIZER, encoder=inputs.encoder,
              clip_name=inputs.clip_name, settings=inputs.settings, positions=inputs.positions,
              encoder_tokenizer=inputs.encoder_tokenizer)
    w, o = s["windows"], s["overflow_share"]
    print(f"dual_tokenize: {w['train']} train / {w['valid']} valid windows in {s['shards']} shards, "
          f"CLIP overflow {o['train']:.2%} / {o['valid']:.2%}, {s['megabytes']:.1f} MB at {s['mb_per_s']:.2f} MB/s, "
          f"{sum(s['validated'].values())} windows validated against the reference tokenizers")
    runlog.record("dual_tokenize", {"timings": runlog.split_timings(s)[1]})


if __name__ == "__main__":
    run(main)
