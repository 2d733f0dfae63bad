"""Stage `corpus`: the adaptation text, one row per whole document.

    outs:   data/corpus/{train,valid}.parquet (doc_id, text), data/corpus/stats.json

`source: hub` loads wiki103 (`wikitext-103-raw-v1`) with `datasets` and regroups its line rows into
articles; `source: generated` writes the embedded profile's deterministic stand-in.
"""
from __future__ import annotations

from xdbert import params as P
from xdbert.data import provided
from xdbert.data.corpus import CorpusSettings, write_corpus
from xdbert.paths import CORPUS
from xdbert.stage import run


def read(p: dict) -> tuple[CorpusSettings, list]:
    """Every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    return CorpusSettings.from_params(p), provided.files(p)


def main() -> None:
    # every check before any work, so a typo costs a second and leaves data/corpus untouched
    settings, files = read(P.load())
    provided.check_files(files)  # the first stage: a missing hand-provided file stops the run here, not hours in
    stats = write_corpus(settings.load(), CORPUS)
    for split, s in stats.items():
        print(f"corpus {split}: {s['documents']} documents, {s['words']} words, {s['characters']} characters")


if __name__ == "__main__":
    run(main)
