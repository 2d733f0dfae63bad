"""Stage `corpus`: the adaptation text, one row per whole document.

    params: profile, corpus.{source, hub_id, hub_config, n_docs, sentences_per_doc, seed}
    outs:   data/corpus/{train,valid}.parquet (doc_id, text), data/corpus/stats.json

`source: hub` loads wiki103 (`wikitext-103-raw-v1`) with `datasets` and regroups its line rows into
articles; `source: generated` writes the embedded profile's deterministic stand-in.
"""
from __future__ import annotations



from xdbert import corpus
from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.stage import run

OUT = "data/corpus"


def _nonempty_str(value, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PipelineError(f"`{key}` must be a non-empty string; got {value!r}")
    return value


def _seed(value, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PipelineError(f"`{key}` must be a non-negative integer; got {value!r}")
    return value


def main() -> None:
    params = P.load()
    sec = P.section(params, "corpus")
    source = P.choice(P.get(sec, "source", "corpus"), "corpus.source", corpus.SOURCES)

    # every check before any work, so a typo costs a second and leaves data/corpus untouched
    if source == "hub":
        kwargs = dict(hub_id=_nonempty_str(P.get(sec, "hub_id", "corpus"), "corpus.hub_id"),
                      hub_config=_nonempty_str(P.get(sec, "hub_config", "corpus"), "corpus.hub_config"))
    else:
        kwargs = dict(n_docs=P.positive(P.get(sec, "n_docs", "corpus"), "corpus.n_docs"),
                      sentences_per_doc=P.positive(P.get(sec, "sentences_per_doc", "corpus"), "corpus.sentences_per_doc"),
                      seed=_seed(P.get(sec, "seed", "corpus"), "corpus.seed"))

    docs = corpus.load_corpus(source, **kwargs)
    stats = corpus.write_corpus(docs, OUT)
    for split, s in stats.items():
        print(f"corpus {split}: {s['documents']} documents, {s['words']} words, {s['characters']} characters")


if __name__ == "__main__":
    run(main)
