"""The adaptation corpus: whole documents, from wiki103 on the hub (paper) or generated (embedded).

Output layout (what the `corpus` stage writes and `dual_tokenize` reads)::

    data/corpus/train.parquet   doc_id: string, text: string (paragraphs joined by "\\n")
    data/corpus/valid.parquet   the same columns
    data/corpus/stats.json      documents, characters, words per split

One row is one DOCUMENT, kept whole: the paper adapts on long contiguous text (512-token BERT
windows cut from running articles), so nothing here splits or shuffles inside a document.
The embedded profile's generator lives in `xdbert.data.synthetic.documents`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from xdbert import params as P
from xdbert.data.mechanism import corpus_world
from xdbert.data.synthetic.documents import generate_corpus
from xdbert.data.synthetic.words import OBJECTS
from xdbert.errors import PipelineError
from xdbert.hub import hub_config_errors, hub_request, source
from xdbert.io import atomic_path, write_parquet

SOURCES = ("generated", "hub")
SPLITS = ("train", "valid")
# wikitext's split names on the hub -> ours
HUB_SPLITS = {"train": "train", "valid": "validation"}
SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.string())])


# ---------------------------------------------------------------------------------------------
# The `corpus` params and where the documents come from
# ---------------------------------------------------------------------------------------------

CORPUS_KEYS = ("source", "hub_id", "hub_config", "n_docs", "sentences_per_doc", "seed")  # a typo among them is refused


@dataclass(frozen=True)
class CorpusSettings:
    """The `corpus` params section, checked. Every key is checked whatever the `source`, so a bad value
    shows before a switch of source, not after; only the chosen source's keys are kept (`hub`: hub_id,
    hub_config; `generated`: n_docs, sentences_per_doc, seed), the others stay None."""

    source: str
    hub_id: str | None = None
    hub_config: str | None = None
    n_docs: int | None = None
    sentences_per_doc: int | None = None
    seed: int | None = None
    objects: tuple | None = None       # generated: the nouns its props are drawn from (`mechanism.extra_objects`)
    patterns: tuple[str, ...] = ()     # generated: the attribute words of object-free sentences (`mechanism.patterns`)

    @classmethod
    def from_params(cls, params: dict) -> "CorpusSettings":
        sec = P.section(params, "corpus", CORPUS_KEYS)
        get = P.getter(sec, "corpus")

        source = P.choice(get("source"), "corpus.source", SOURCES)
        hub = dict(hub_id=P.nonempty_str(get("hub_id"), "corpus.hub_id"),
                   hub_config=P.nonempty_str(get("hub_config"), "corpus.hub_config"))
        objects, patterns = corpus_world(params)  # the mechanism study's words, not its facts: see its module
        generated = dict(n_docs=P.positive(get("n_docs"), "corpus.n_docs"),
                         sentences_per_doc=P.positive(get("sentences_per_doc"), "corpus.sentences_per_doc"),
                         seed=P.non_negative(get("seed"), "corpus.seed"), objects=tuple(objects), patterns=patterns)
        return cls(source, **(hub if source == "hub" else generated))

    def load(self) -> dict[str, list[str]]:
        """The documents per split (`load_corpus` with this source's keys)."""
        if self.source == "hub":
            return load_corpus(self.source, hub_id=self.hub_id, hub_config=self.hub_config)
        return load_corpus(self.source, n_docs=self.n_docs, sentences_per_doc=self.sentences_per_doc, seed=self.seed,
                           objects=self.objects, patterns=self.patterns)


def load_corpus(source: str, *, hub_id: str = "", hub_config: str = "", n_docs: int = 0,
                sentences_per_doc: int = 0, seed: int = 0, objects: tuple | None = None, patterns: tuple[str, ...] = (),
                cache_dir: str | None = None) -> dict[str, list[str]]:
    """Documents per split from the configured source (`generated` or `hub`)."""
    if source == "generated":
        docs = generate_corpus(n_docs, sentences_per_doc, seed, list(objects or OBJECTS), patterns)
    elif source == "hub":
        docs = load_hub_corpus(hub_id, hub_config, cache_dir=cache_dir)
    else:
        raise PipelineError(f"unknown corpus.source {source!r}; allowed: {', '.join(SOURCES)}")
    for split in SPLITS:
        if not docs.get(split):
            raise PipelineError(f"the corpus from source `{source}` has no documents in split `{split}` (no text lines found); check `corpus` params")
    return docs


# ---------------------------------------------------------------------------------------------
# Reading wiki103 from the hub
# ---------------------------------------------------------------------------------------------

# ` = Title = ` starts an article; ` = = Section = = ` (two or more '=') is a heading inside one.
_TITLE = re.compile(r"=\s(?!=)(.*?)(?<!=)\s=")
_HEADING = re.compile(r"(=\s)+.*?(\s=)+")
# wikitext escapes hyphens and separators inside numbers as " @-@ ", " @,@ ", " @.@ "; undone so
# both tokenizers see ordinary text ("1 @,@ 000" would otherwise cost five CLIP tokens).
_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def is_title(line: str) -> bool:
    """True for a top-level wikitext heading ` = Title = ` (exactly one '=' on each side)."""
    return _TITLE.fullmatch(line.strip()) is not None


def documents_from_lines(lines: Iterable[str]) -> Iterator[str]:
    """Regroup wikitext's one-row-per-line layout into whole articles.

    A new article starts at each title line. Headings (the title and ` = = Section = = ` lines) are
    dropped, like BERT's own Wikipedia preprocessing which keeps text passages only: a heading is a
    label, not a sentence, and would sit inside a 512-token window as a fragment. Empty lines are
    dropped; the remaining lines are the article's paragraphs, joined by "\\n". Lines before the
    first title (none in wiki103) form a document of their own rather than being lost.
    """
    paragraphs: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if is_title(line):
            if paragraphs:
                yield "\n".join(paragraphs)
            paragraphs = []
            continue
        if _HEADING.fullmatch(line):
            continue
        for old, new in _ESCAPES:
            line = line.replace(old, new)
        paragraphs.append(line)
    if paragraphs:
        yield "\n".join(paragraphs)


def load_hub_corpus(hub_id: str, hub_config: str, cache_dir: str | None = None) -> dict[str, list[str]]:
    """wiki103 (or any dataset with wikitext's layout: a `text` column of raw lines) as documents.

    `hub_id` is a hub id (`wikitext`) or a local folder in the hub's layout; both go through
    `datasets.load_dataset`, so tests exercise this exact code on files they write.
    """
    import datasets

    with hub_config_errors("corpus", hub_id, hub_config), hub_request(f"corpus `{hub_id}` ({hub_config}) from the hub"):
        ds = datasets.load_dataset(source(hub_id, "dataset"), hub_config, cache_dir=cache_dir)
    out: dict[str, list[str]] = {}
    for ours, theirs in HUB_SPLITS.items():
        if theirs not in ds:
            raise PipelineError(f"corpus `{hub_id}` ({hub_config}) has no split `{theirs}`; it has: {', '.join(ds)}")
        if "text" not in ds[theirs].column_names:
            raise PipelineError(f"corpus `{hub_id}` ({hub_config}) has no `text` column; columns: {', '.join(ds[theirs].column_names)}")
        column = ds[theirs].data.column("text")  # Arrow, read chunk by chunk: wiki103 has 1.8M lines
        out[ours] = list(documents_from_lines(line for chunk in column.chunks for line in chunk.to_pylist()))
    return out


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def corpus_stats(docs: list[str]) -> dict[str, int]:
    """Documents, characters and whitespace-separated words of one split."""
    return {
        "documents": len(docs),
        "characters": sum(len(d) for d in docs),
        "words": sum(len(d.split()) for d in docs),
    }


def write_corpus(splits: dict[str, list[str]], out_dir: str | Path) -> dict[str, dict[str, int]]:
    """Write `<out_dir>/{train,valid}.parquet` and `stats.json` as one atomic directory (`load_corpus` has
    checked that every split has documents)."""
    stats = {split: corpus_stats(splits[split]) for split in SPLITS}
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            docs = splits[split]
            ids = [f"{split}-{i:07d}" for i in range(len(docs))]
            table = pa.Table.from_arrays([pa.array(ids, pa.string()), pa.array(docs, pa.string())], schema=SCHEMA)
            write_parquet(table, tmp / f"{split}.parquet")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return stats
