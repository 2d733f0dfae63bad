"""The corpus stage: wiki103 regrouped into whole articles, the generated stand-in, and the stage's errors."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from xdbert.data import corpus
from xdbert.data.corpus import CorpusSettings
from xdbert.data.synthetic.words import EXTRA_OBJECTS, OBJECTS, PATTERNS
from xdbert.data.synthetic.documents import generate_corpus
from xdbert.data.synthetic.words import OBJECTS, RARE_WORDS
from xdbert.errors import PipelineError
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "wikitext-103-raw-v1"

# raw lines exactly as wikitext-103-raw-v1 stores them on the hub (one row per line, spaces kept)
TRAIN_LINES = [
    "",
    " = Valkyria Chronicles III = \n",
    " \n",
    " Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ playing video game . \n",
    " \n",
    " = = Gameplay = = \n",
    " \n",
    " The game sold 1 @,@ 000 copies , about 2 @.@ 5 per cent of the first . \n",
    " = = = Plot details = = = \n",
    " The story follows Squad 422 . \n",
    " = Tower Building of the Little Rock Arsenal = \n",
    " \n",
    " The Tower Building is a structure in Little Rock . \n",
    " It was built in 1840 . \n",
]
VALID_LINES = [" = Robert Boulter = \n", " \n", " Robert Boulter is an English actor . \n"]
TEST_LINES = [" = Homarus gammarus = \n", " Homarus gammarus is a lobster . \n"]


def write_hub_layout(root: Path, config: str = CONFIG, train=TRAIN_LINES, valid=VALID_LINES) -> Path:
    """A folder laid out like the hub's `wikitext` dataset repo (parquet per split + README configs)."""
    (root / config).mkdir(parents=True)
    for split, lines in (("train", train), ("validation", valid), ("test", TEST_LINES)):
        pd.DataFrame({"text": lines}).to_parquet(root / config / f"{split}-00000-of-00001.parquet", index=False)
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        f"- config_name: {config}\n  data_files:\n"
        f"  - split: test\n    path: {config}/test-*\n"
        f"  - split: train\n    path: {config}/train-*\n"
        f"  - split: validation\n    path: {config}/validation-*\n"
        "---\n# wikitext (test copy)\n"
    )
    return root


def test_title_detection():
    assert corpus.is_title(" = Valkyria Chronicles III = \n")
    assert corpus.is_title("= 2 =")
    assert not corpus.is_title(" = = Gameplay = = \n")
    assert not corpus.is_title(" = = = Plot details = = = ")
    assert not corpus.is_title(" The sum 1 = 2 is false . ")


def test_documents_from_lines_keeps_articles_whole_and_drops_headings():
    docs = list(corpus.documents_from_lines(TRAIN_LINES))
    assert docs == [
        "Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role-playing video game .\n"
        "The game sold 1,000 copies , about 2.5 per cent of the first .\n"
        "The story follows Squad 422 .",
        "The Tower Building is a structure in Little Rock .\nIt was built in 1840 .",
    ]
    # text before the first title is kept as its own document, not lost
    assert list(corpus.documents_from_lines([" Intro line . \n", " = A = \n", " body \n"])) == ["Intro line .", "body"]
    assert list(corpus.documents_from_lines([" \n", " = A = \n", " \n"])) == []


def test_hub_loader_reads_local_folder_in_hub_layout(tmp_path):
    root = write_hub_layout(tmp_path / "wikitext")
    docs = corpus.load_hub_corpus(str(root), CONFIG, cache_dir=str(tmp_path / "cache"))
    assert set(docs) == {"train", "valid"}
    assert docs["train"] == list(corpus.documents_from_lines(TRAIN_LINES))
    assert docs["valid"] == ["Robert Boulter is an English actor ."]


def test_hub_loader_unknown_config_is_a_pipeline_error(tmp_path):
    root = write_hub_layout(tmp_path / "wikitext")
    with pytest.raises(PipelineError, match="no config 'wikitext-2-raw-v1'"):
        corpus.load_hub_corpus(str(root), "wikitext-2-raw-v1", cache_dir=str(tmp_path / "cache"))


def test_offline_hub_request_says_what_to_do(tmp_path):
    # conftest sets HF_HUB_OFFLINE=1: the real hub id must fail at once with the clear message
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE=1"):
        corpus.load_corpus("hub", hub_id="Salesforce/wikitext", hub_config=CONFIG, cache_dir=str(tmp_path / "cache"))


def test_empty_hub_corpus_is_a_pipeline_error(tmp_path):
    root = write_hub_layout(tmp_path / "wikitext", train=[" \n", " = = Only a heading = = \n"])
    with pytest.raises(PipelineError, match="no documents in split `train`"):
        corpus.load_corpus("hub", hub_id=str(root), hub_config=CONFIG, cache_dir=str(tmp_path / "cache"))


def test_generated_corpus_is_deterministic_and_sized():
    a = generate_corpus(20, 12, seed=3)
    assert a == generate_corpus(20, 12, seed=3)
    assert a != generate_corpus(20, 12, seed=4)
    assert len(a["train"]) == 20 and len(a["valid"]) == 2
    assert len(set(a["train"])) == 20 and not set(a["train"]) & set(a["valid"])
    # sentences_per_doc sentences per document: each ends in . ! or ? (quotes close after them)
    for doc in a["train"]:
        ends = re.findall(r"[.!?]\"?(?= |\n|$)", doc)
        assert len(ends) >= 12
        assert all(p.strip() for p in doc.split("\n"))


def test_generated_documents_are_coherent_and_varied():
    docs = generate_corpus(50, 30, seed=0)["train"]
    words = [w for d in docs for w in re.findall(r"[a-z]+", d.lower())]
    assert len(set(words)) > 500  # a real vocabulary, not a handful of tokens
    for doc in docs[:10]:
        # a document keeps returning to its own few objects: the most frequent object noun recurs
        nouns = [w for w in re.findall(r"[a-z]+", doc.lower()) if w in {o.sing for o in OBJECTS}]
        assert max(nouns.count(n) for n in set(nouns)) >= 5
    assert any(w in RARE_WORDS for w in words)
    assert {"purchased", "repaired"} & set(words)  # synonyms occur, so re-worded task text is in-vocabulary


def test_generated_corpus_rejects_bad_sizes():
    with pytest.raises(PipelineError, match="corpus.n_docs"):
        generate_corpus(0, 10, 0)
    with pytest.raises(PipelineError, match="corpus.sentences_per_doc"):
        generate_corpus(10, -1, 0)
    with pytest.raises(PipelineError, match="allowed: generated, hub"):
        corpus.load_corpus("wiki", n_docs=1, sentences_per_doc=1)


def test_write_corpus_schema_and_stats(tmp_path):
    docs = {"train": ["a b c\nd e", "f"], "valid": ["g h"]}
    stats = corpus.write_corpus(docs, tmp_path / "corpus")
    table = pq.read_table(tmp_path / "corpus" / "train.parquet")
    assert table.schema.names == ["doc_id", "text"]
    assert str(table.schema.field("doc_id").type) == "string" and str(table.schema.field("text").type) == "string"
    assert table.column("text").to_pylist() == docs["train"]
    assert len(set(table.column("doc_id").to_pylist())) == 2
    assert stats == json.loads((tmp_path / "corpus" / "stats.json").read_text())
    assert stats["train"] == {"documents": 2, "characters": 10, "words": 6}
    assert stats["valid"] == {"documents": 1, "characters": 3, "words": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no temp directory left


def _stage(tmp_path: Path, **overrides) -> subprocess.CompletedProcess:
    params = {"profile": "embedded", "corpus": {"source": "generated", "hub_id": "wikitext", "hub_config": CONFIG,
                                                "n_docs": 12, "sentences_per_doc": 8, "seed": 0},
              "mechanism": {"extra_objects": 0, "patterns": []}}  # the only keys of the section the corpus reads
    params["corpus"].update(overrides)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return subprocess.run([sys.executable, str(ROOT / "stages" / "corpus.py")], cwd=tmp_path, capture_output=True, text=True)


def corpus_params(**overrides) -> dict:
    params = values("embedded")
    params["corpus"].update(overrides)
    return params


def test_settings_keep_only_the_keys_of_their_source_and_check_every_key():
    assert CorpusSettings.from_params(values("embedded")) == CorpusSettings(
        "generated", n_docs=900, sentences_per_doc=30, seed=0, objects=tuple(OBJECTS + EXTRA_OBJECTS),
        patterns=tuple(PATTERNS))  # the mechanism study's 80 objects and its attribute words
    hub = CorpusSettings.from_params(corpus_params(source="hub"))
    assert hub == CorpusSettings("hub", hub_id="wikitext", hub_config=CONFIG)
    # a key the source does not read is checked all the same: the error shows before a switch of source
    with pytest.raises(PipelineError, match="`corpus.n_docs` must be a positive integer; got 0"):
        CorpusSettings.from_params(corpus_params(source="hub", n_docs=0))
    with pytest.raises(PipelineError, match="`corpus.hub_id` must be a non-empty string; got 5"):
        CorpusSettings.from_params(corpus_params(hub_id=5))


@pytest.mark.parametrize("overrides, message", [
    (dict(source="wiki"), "unknown corpus.source 'wiki'; allowed: generated, hub"),
    (dict(n_docs=0), "`corpus.n_docs` must be a positive integer"),
    (dict(sentences_per_doc=2.5), "`corpus.sentences_per_doc` must be a positive integer"),
    (dict(seed=-1), "`corpus.seed` must be a non-negative integer"),
    (dict(seed=True), "`corpus.seed` must be a non-negative integer"),
    (dict(source="hub", hub_id=""), "`corpus.hub_id` must be a non-empty string"),
    (dict(source="hub", hub_config=None), "`corpus.hub_config` must be a non-empty string"),
])
def test_settings_errors_name_the_key(overrides, message):
    with pytest.raises(PipelineError) as e:
        CorpusSettings.from_params(corpus_params(**overrides))
    assert message in str(e.value)


def test_settings_missing_key_or_section():
    params = values("embedded")
    del params["corpus"]["seed"]
    with pytest.raises(PipelineError, match="missing param `corpus.seed`"):
        CorpusSettings.from_params(params)
    with pytest.raises(PipelineError, match="no section `corpus`"):
        CorpusSettings.from_params({"profile": "embedded"})


def test_stage_writes_corpus_and_keeps_it_on_bad_params(tmp_path):
    ok = _stage(tmp_path)
    assert ok.returncode == 0, ok.stderr
    out = tmp_path / "data" / "corpus"
    assert sorted(p.name for p in out.iterdir()) == ["stats.json", "train.parquet", "valid.parquet"]
    assert json.loads((out / "stats.json").read_text())["train"]["documents"] == 12
    before = (out / "train.parquet").read_bytes()

    r = _stage(tmp_path, n_docs=0)
    assert r.returncode == 2 and "corpus.n_docs" in r.stderr and "Traceback" not in r.stderr
    assert (out / "train.parquet").read_bytes() == before

    again = _stage(tmp_path)  # same params, same bytes
    assert again.returncode == 0 and (out / "train.parquet").read_bytes() == before


def test_stage_hub_source_from_local_folder(tmp_path):
    root = write_hub_layout(tmp_path / "wikitext")
    r = _stage(tmp_path, source="hub", hub_id=str(root))
    assert r.returncode == 0, r.stderr
    train = pq.read_table(tmp_path / "data" / "corpus" / "train.parquet").column("text").to_pylist()
    assert train == list(corpus.documents_from_lines(TRAIN_LINES))
