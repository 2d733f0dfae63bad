"""Visually grounded ratio (paper Figure 4, Appendix D): the counting rule, the comparison, the figure."""
import json

import numpy as np
import pandas as pd
import pytest

from conftest import load_stage
from xdbert.analysis import figure4
from xdbert.analysis import grounding as G
from xdbert.analysis.grounding_settings import GroundingSettings
from xdbert.data.provided import read_coco_captions
from xdbert.data.synthetic.words import generate_captions
from xdbert.errors import PipelineError
from xdbert import paths
from xdbert.profiles import values

STOP = frozenset({"the", "s", "over", "a"})

# "The boy's red kite flew over the park, quarantine!" as BERT word pieces
PIECES = ["the", "boy", "'", "s", "red", "kite", "flew", "over", "the", "park", ",", "qu", "##aran", "##tine", "!"]
COUNTS = {"boy": 101, "red": 100, "kite": 500, "flew": 3, "park": 1000, "quarantine": 150,
          "qu": 5000, "the": 9000, ",": 800}


def fake_tokenize(texts):
    table = {"The boy's red kite flew over the park, quarantine!": PIECES, "a kite": ["a", "kite"], ", .": [",", "."]}
    return [table[t] for t in texts]


def test_hand_made_example_counted_by_the_rule():
    words = G.text_words(["The boy's red kite flew over the park, quarantine!"], fake_tokenize)[0]
    assert words == ["the", "boy", "'", "s", "red", "kite", "flew", "over", "the", "park", ",", "quarantine", "!"]
    classes = G.classify(words, STOP, COUNTS, threshold=100)
    assert classes == ["stopword", "grounded", "punctuation", "stopword", "not_grounded", "grounded", "not_grounded",
                       "stopword", "stopword", "grounded", "punctuation", "grounded", "punctuation"]
    count = G.count_classes(classes)
    # grounded: boy, kite, park, quarantine (the merged word, not its pieces); not: red (100 is not > 100), flew
    assert (count.grounded, count.not_grounded) == (4, 2)
    assert count.ratio == pytest.approx(4 / 6)
    assert G.mark_words(words, classes) == "(the) **boy** (') (s) red **kite** flew (over) (the) **park** (,) **quarantine** (!)"


def test_threshold_is_strictly_greater():
    words = ["red"]
    assert G.classify(words, STOP, {"red": 100}, threshold=100) == ["not_grounded"]
    assert G.classify(words, STOP, {"red": 101}, threshold=100) == ["grounded"]
    assert G.classify(words, STOP, {"red": 100}, threshold=99) == ["grounded"]


def test_specials_and_empty_examples():
    assert G.classify(["[unk]", "kite"], STOP, {"kite": 200, "[unk]": 999}, 100, specials=frozenset({"[unk]"})) == ["punctuation", "grounded"]
    assert np.isnan(G.count_classes(G.classify([",", "the"], STOP, {}, 100)).ratio)


def test_caption_counts_use_merged_words():
    counts = G.caption_word_counts(["The boy's red kite flew over the park, quarantine!", "a kite"], fake_tokenize, batch_size=1)
    assert counts["kite"] == 2 and counts["quarantine"] == 1 and "qu" not in counts and "##aran" not in counts


def test_wordpiece_tokenizer_adapter():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "the": 4, "dog": 5, "##s": 6, "run": 7, ".": 8}
    t = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]")
    tokenize, prefix, specials = G.wordpiece_tokenizer(tok)
    assert prefix == "##" and "[unk]" in specials
    assert G.text_words(["The dogs run.", "cats"], tokenize, prefix) == [["the", "dogs", "run", "."], ["[unk]"]]


def test_stopword_list_is_nltk_english():
    sw = G.load_stopwords()
    assert len(sw) == 179
    assert {"the", "is", "under", "which", "been", "don't", "wouldn"} <= sw
    assert not {"one", "man", "dog"} & sw
    with pytest.raises(PipelineError, match="missing stopword list"):
        G.load_stopwords("/nonexistent/stop.txt")


def test_a_stopword_file_that_is_not_text_is_one_error(tmp_path):
    (tmp_path / "sw.bin").write_bytes(b"\xc0\xff\x00")
    with pytest.raises(PipelineError, match=r"sw.bin \(`grounding.stopwords`\) is not UTF-8 text"):
        G.load_stopwords(tmp_path / "sw.bin")


def predictions(correct_by_idx, seeds=(0, 1, 2)):
    rows = []
    for idx, pattern in correct_by_idx.items():
        for seed, c in zip(seeds, pattern):
            rows.append({"seed": seed, "split": "dev", "idx": idx, "prediction": int(c), "label": 1, "correct": bool(c)})
    return pd.DataFrame(rows)


def test_improved_on_par_worsened():
    base = predictions({0: [0, 0, 0], 1: [1, 1, 1], 2: [1, 0, 1], 3: [1, 1, 0], 4: [0, 0, 1]})
    prop = predictions({0: [1, 1, 1], 1: [0, 1, 0], 2: [0, 1, 1], 3: [1, 1, 1], 4: [0, 0, 1]})
    out = G.compare_models(base, prop)
    assert out["idx"].tolist() == [0, 1, 2, 3, 4]
    assert out["baseline_correct"].tolist() == [0, 3, 2, 2, 1]
    assert out["proposed_correct"].tolist() == [3, 1, 2, 3, 1]
    assert out["delta"].tolist() == [3, -2, 0, 1, 0]
    assert out["change"].tolist() == ["improved", "worsened", "on_par", "improved", "on_par"]
    assert int(out["delta"].sum()) == 2  # extra correct answers over all seeds
    assert out.attrs["n_seeds"] == 3


def test_compare_requires_same_seeds_and_examples():
    base = predictions({0: [1, 1, 1]})
    with pytest.raises(PipelineError, match=r"seeds \[0, 1, 2\] but `xdbert` has \[0, 1\]"):
        G.compare_models(base, predictions({0: [1, 1]}, seeds=(0, 1)))
    with pytest.raises(PipelineError, match="different dev examples"):
        G.compare_models(base, predictions({1: [1, 1, 1]}))


def test_class_summary_and_test():
    s = G.class_summary(np.array([0.0, 0.25, 0.5, 1.0, np.nan]))
    assert s["n"] == 4 and s["no_content_words"] == 1
    assert s["median"] == pytest.approx(0.375) and s["mean"] == pytest.approx(0.4375)
    assert s["q1"] == pytest.approx(0.1875) and s["q3"] == pytest.approx(0.625)
    assert G.improved_vs_worsened(np.linspace(0.6, 0.9, 20), np.linspace(0.1, 0.4, 20)) < 1e-6


def test_box_plot_is_a_png(tmp_path):
    rng = np.random.default_rng(0)
    ratios = {t: {"improved": rng.uniform(0.3, 0.8, 30), "worsened": rng.uniform(0.1, 0.6, 25)} for t in ("rte", "mrpc")}
    ratios["cola"] = {"improved": [], "worsened": [0.5, np.nan]}  # an empty class still plots
    path = figure4.plot_boxes(ratios, tmp_path / "figure4.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


# ----------------------------------------------------------------------------------------------------
# The stage, end to end on generated tasks, a trained WordPiece tokenizer and hand-made predictions
# ----------------------------------------------------------------------------------------------------

def test_stage_writes_figure4(tmp_path, monkeypatch):
    import yaml

    from xdbert.data.synthetic.tasks import generate_task
    from xdbert.data.tasks.registry import write_tasks
    from xdbert.data.tokenization.vocab import train_wordpiece

    tasks = ("rte", "mrpc", "cola")
    tables = {t: generate_task(t, 10, 40, 0) for t in tasks}
    write_tasks(tables, tmp_path / "data" / "tasks", "generated")
    texts = generate_captions(500, 1) + [x for t in tables.values() for x in t["dev"].column("text_a").to_pylist()]
    train_wordpiece(texts, 1500, 128).save_pretrained(tmp_path / "models" / "tokenizer")
    rng = np.random.default_rng(0)
    extra = {}
    for t in tasks:
        dev = tables[t]["dev"].to_pandas()
        base = {i: rng.random(3) < 0.5 for i in dev["idx"]}
        prop = {i: rng.random(3) < 0.6 for i in dev["idx"]}
        extra[t] = int(sum(v.sum() for v in prop.values()) - sum(v.sum() for v in base.values()))
        for model, table in (("baseline", base), ("xdbert", prop)):
            path = tmp_path / "results" / "finetune" / t / "tiny" / model / "predictions.parquet"
            path.parent.mkdir(parents=True)
            predictions(table).to_parquet(path)
    params = {"profile": "embedded", "tasks": {"names": list(tasks)}, "adapt": {"family": "tiny"},
              "families": {"tiny": {"label": "Tiny", "size": "base", "layer_lr_decay": 1.0}}, "grounding": {
        "tasks": list(tasks), "baseline": "baseline", "model": "xdbert", "threshold": 20, "captions": "generated",
        "captions_hub_split": "train", "captions_hub_column": "caption", "n_captions": 3000, "seed": 0,
        "stopwords": "", "examples_task": "rte", "examples_per_class": 2},
        "mechanism": {**values("embedded")["mechanism"], "enabled": False}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError, match=r"missing data/captions/word_counts.json: run `dvc repro captions`"):
        load_stage("grounding").main()
    load_stage("captions").main()  # the caption corpus's word counts, which grounding reads
    load_stage("grounding").main()

    out = json.loads((tmp_path / "results" / "grounding.json").read_text())
    for t in tasks:
        assert out["tasks"][t]["extra_correct"] == extra[t]
        assert out["tasks"][t]["seeds"] == 3 and out["tasks"][t]["examples"] == 40
        assert sum(c["n"] + c["no_content_words"] for c in out["tasks"][t]["classes"].values()) == 40
    assert (tmp_path / "reports" / "figure4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "reports" / "figure4.md").read_text()
    assert "| RTE | 3 | 40 |" in md and f"{extra['rte']:+d}" in md and "**" in md and "### worsened" in md
    assert read_coco_captions(tmp_path / "data" / "captions" / "captions.json") == generate_captions(3000, 0)

    (tmp_path / "results" / "finetune" / "mrpc" / "tiny" / "xdbert" / "predictions.parquet").unlink()
    with pytest.raises(PipelineError, match=r"missing results/finetune/mrpc/tiny/xdbert/predictions.parquet: .* runs of tiny there: baseline$"):
        load_stage("grounding").main()
    params["grounding"]["captions"] = "coco/captions_train2017.json"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="missing caption file coco/captions_train2017.json"):
        load_stage("captions").main()
    assert read_coco_captions(tmp_path / "data" / "captions" / "captions.json") == generate_captions(3000, 0)  # kept


def test_extreme_examples_pick_largest_changes():
    cmp = pd.DataFrame({"idx": [0, 1, 2, 3, 4, 5], "delta": [1, 3, 0, -2, -1, 0],
                        "change": ["improved", "improved", "on_par", "worsened", "worsened", "on_par"]})
    picked = G.extreme_examples(cmp, 1)
    assert picked["improved"]["idx"].tolist() == [1]
    assert picked["worsened"]["idx"].tolist() == [3]
    assert picked["on_par"]["idx"].tolist() == [2]


# ----------------------------------------------------------------------------------------------------
# The `grounding` params
# ----------------------------------------------------------------------------------------------------

def grounding_params(**overrides) -> dict:
    params = values("embedded")
    params["grounding"].update(overrides)
    return params


@pytest.fixture
def predictions_present(tmp_path, monkeypatch):
    """The working directory holds (empty) prediction files of both runs for the embedded profile's tasks."""
    monkeypatch.chdir(tmp_path)
    g = values("embedded")["grounding"]
    for run in (f"bert/{g['baseline']}", f"bert/{g['model']}"):  # the runs of `adapt.family`
        for task in g["tasks"]:
            paths.predictions(task, run).parent.mkdir(parents=True)
            paths.predictions(task, run).touch()


def test_settings_from_the_embedded_profile(predictions_present):
    s = GroundingSettings.from_params(values("embedded"))
    assert s.tasks == ("rte", "mrpc", "cola") and s.names == ("bert/baseline", "bert/xdbert")
    assert (s.threshold, s.stopwords) == (100, None)
    with pytest.raises(PipelineError, match="`grounding.baseline` and `grounding.model` both name 'xdbert'"):
        GroundingSettings.from_params(grounding_params(baseline="xdbert"), files=False)


@pytest.mark.parametrize("overrides, message", [
    ({"tasks": ["rte", "swag"]}, "unknown entry of `grounding.tasks` 'swag'"),
    ({"threshold": 0}, "`grounding.threshold` must be a positive integer"),
    ({"examples_per_class": 1.5}, "`grounding.examples_per_class` must be a positive integer"),
    ({"examples_task": "qnli"}, "unknown grounding.examples_task 'qnli'; allowed: rte, mrpc, cola"),
    ({"model": "full"}, "missing results/finetune/rte/bert/full/predictions.parquet: `grounding.model` names a run the "
                        "finetune stage did not write for `rte`; runs of bert there: baseline, xdbert"),
    ({"model": 5}, "`grounding.model` must be a non-empty string; got 5"),
    ({"stopwords": ["a"]}, "`grounding.stopwords` must be a stopword file"),
])
def test_settings_errors_name_the_key(predictions_present, overrides, message):
    with pytest.raises(PipelineError) as e:
        GroundingSettings.from_params(grounding_params(**overrides))
    assert message in str(e.value)


def test_a_task_the_study_does_not_finetune_is_refused(predictions_present):
    params = grounding_params()
    params["tasks"]["names"] = ["rte", "mrpc", "sst2"]  # no cola: the finetune stage writes no predictions for it
    with pytest.raises(PipelineError, match="unknown entry of `grounding.tasks` 'cola'; allowed: rte, mrpc, sst2"):
        GroundingSettings.from_params(params, files=False)

