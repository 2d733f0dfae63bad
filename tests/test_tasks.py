"""The tasks stage: registry, hub loaders on local copies in the hub's layout, generated stand-ins
(schema, determinism, real semantics, learnability by simple baselines) and the stage's errors."""
import json
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction import FeatureHasher
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression, Ridge

from xdbert.data.synthetic.documents import generate_corpus
from xdbert.data.synthetic.glue import gen_cola
from xdbert.data.synthetic.readability import READ_NOISE, readability_features, readability_target
from xdbert.data.synthetic.tasks import generate_task
from xdbert.data.mechanism import MechanismSettings
from xdbert.data.synthetic.words import AFFORDANCES, INTRANSITIVE, PATTERNS, SYNONYM_FORMS, VERBS
from xdbert.data.tasks import TASK_NAMES, compute_metrics, get_task, schema
from xdbert.data.tasks.names import task_names
from xdbert.data.tasks import hub
from xdbert.data.tasks.settings import TasksSettings
from xdbert.errors import PipelineError
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
TRAIN, DEV = 600, 200


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, pa.Table]]:
    return {name: generate_task(name, TRAIN, DEV, seed=0) for name in TASK_NAMES}


def frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()


# ------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------

def test_registry_matches_the_paper():
    assert TASK_NAMES == ("rte", "mrpc", "stsb", "cola", "sst2", "qnli", "qqp", "mnli", "swag", "read")
    headline = {name: get_task(name).metric for name in TASK_NAMES}
    assert headline == {"rte": "accuracy", "mrpc": "f1", "stsb": "spearman", "cola": "matthews", "sst2": "accuracy",
                        "qnli": "accuracy", "qqp": "accuracy", "mnli": "accuracy", "swag": "accuracy", "read": "rmse"}
    # Table 5, as the paper profile writes it out: base 1e-4 for RTE/MRPC/STS-B, 2e-5 otherwise; large 5e-5 / 1e-5
    rates = values("paper")["finetune"]["lr"]
    for name in TASK_NAMES:
        high = name in ("rte", "mrpc", "stsb")
        assert (rates[name]["base"], rates[name]["large"]) == ((1e-4, 5e-5) if high else (2e-5, 1e-5)), name
    assert get_task("mnli").dev_splits == ("dev_matched", "dev_mismatched")
    assert get_task("mnli").num_labels == 3 and get_task("swag").num_labels == 4
    assert [n for n in TASK_NAMES if not get_task(n).pair] == ["cola", "sst2", "read"]
    assert [n for n in TASK_NAMES if get_task(n).kind == "regression"] == ["stsb", "read"]
    assert not get_task("read").higher_is_better


def test_vis_is_a_task_but_not_one_of_tasks_names():
    vis = get_task("vis")
    assert (vis.kind, vis.num_labels, vis.pair, vis.dev_splits, vis.metric) == ("classification", 4, False, ("dev",), "accuracy")
    assert vis.label_names == tuple(PATTERNS) and "vis" not in TASK_NAMES
    with pytest.raises(PipelineError, match="`tasks.names` lists 'vis', the mechanism study's probe task"):
        TasksSettings.from_params(tasks_params(names=["rte", "vis"]))
    with pytest.raises(PipelineError, match="`tasks.names` lists 'vis'"):
        task_names(tasks_params(names=["vis"]))


def test_mechanism_needs_all_four_patterns_in_any_order():
    p = values("embedded")
    p["mechanism"]["patterns"] = ["floral", "plaid", "spotted", "striped"]  # a label is the word's position
    assert MechanismSettings.from_params(p).patterns == ("floral", "plaid", "spotted", "striped")
    p["mechanism"]["patterns"] = ["striped", "spotted", "plaid"]
    with pytest.raises(PipelineError, match="`mechanism.patterns` must list all four attribute words"):
        MechanismSettings.from_params(p)
    p["mechanism"]["enabled"] = False  # off, the corpus may use any of them
    assert MechanismSettings.from_params(p).patterns == ("striped", "spotted", "plaid")


def test_unknown_task_lists_allowed_names():
    with pytest.raises(PipelineError) as e:
        get_task("wnli")
    assert "wnli" in str(e.value) and all(n in str(e.value) for n in TASK_NAMES)


# ------------------------------------------------------------------------------------------------
# Hub loaders, pointed at local folders in the hub's layout
# ------------------------------------------------------------------------------------------------

def write_hub_repo(root: Path, configs: dict[str, dict[str, pd.DataFrame]]) -> Path:
    """`<root>/<config>/<split>-00000-of-00001.parquet` + README.md `configs:` as the hub's parquet export."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        (root / config).mkdir(parents=True)
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, df in splits.items():
            df.to_parquet(root / config / f"{split}-00000-of-00001.parquet", index=False)
            lines += [f"  - split: {split}", f"    path: {config}/{split}-*"]
    (root / "README.md").write_text("\n".join(lines + ["---", "# test copy"]) + "\n")
    return root


def glue_frames() -> dict[str, dict[str, pd.DataFrame]]:
    i32 = np.int32
    rte = {
        "train": pd.DataFrame({"sentence1": ["A man rides a bike.", "It rains."], "sentence2": ["A man rides.", "It is dry."],
                               "label": np.array([0, 1], dtype=np.int64), "idx": np.array([0, 1], dtype=i32)}),
        "validation": pd.DataFrame({"sentence1": ["Dogs bark."], "sentence2": ["Animals bark."],
                                    "label": np.array([0], dtype=np.int64), "idx": np.array([0], dtype=i32)}),
        "test": pd.DataFrame({"sentence1": ["x"], "sentence2": ["y"], "label": np.array([-1], dtype=np.int64),
                              "idx": np.array([0], dtype=i32)}),
    }
    cola = {
        "train": pd.DataFrame({"sentence": ["The dog barks.", "Dog the barks."], "label": np.array([1, 0]), "idx": np.array([0, 1], dtype=i32)}),
        "validation": pd.DataFrame({"sentence": ["He left."], "label": np.array([1]), "idx": np.array([7], dtype=i32)}),
        "test": pd.DataFrame({"sentence": ["?"], "label": np.array([-1]), "idx": np.array([0], dtype=i32)}),
    }
    stsb = {
        "train": pd.DataFrame({"sentence1": ["a", "b"], "sentence2": ["a", "c"], "label": np.array([5.0, 0.8], dtype=np.float32),
                               "idx": np.array([0, 1], dtype=i32)}),
        "validation": pd.DataFrame({"sentence1": ["d"], "sentence2": ["e"], "label": np.array([3.8], dtype=np.float32),
                                    "idx": np.array([0], dtype=i32)}),
        "test": pd.DataFrame({"sentence1": ["f"], "sentence2": ["g"], "label": np.array([-1.0], dtype=np.float32),
                              "idx": np.array([0], dtype=i32)}),
    }
    mnli = {
        "train": pd.DataFrame({"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"], "label": [0, 1, 2],
                               "idx": np.array([0, 1, 2], dtype=i32)}),
        "validation_matched": pd.DataFrame({"premise": ["m"], "hypothesis": ["mh"], "label": [2], "idx": np.array([0], dtype=i32)}),
        "validation_mismatched": pd.DataFrame({"premise": ["mm", "mm2"], "hypothesis": ["mmh", "mmh2"], "label": [1, 0],
                                               "idx": np.array([0, 1], dtype=i32)}),
        "test_matched": pd.DataFrame({"premise": ["t"], "hypothesis": ["th"], "label": [-1], "idx": np.array([0], dtype=i32)}),
        "test_mismatched": pd.DataFrame({"premise": ["t"], "hypothesis": ["th"], "label": [-1], "idx": np.array([0], dtype=i32)}),
    }
    return {"rte": rte, "cola": cola, "stsb": stsb, "mnli": mnli}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    return write_hub_repo(tmp_path_factory.mktemp("hub") / "glue", glue_frames())


def rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


def test_glue_loader_normalizes_pairs_singles_and_regression(glue_dir, tmp_path):
    cache = str(tmp_path / "cache")
    rte = hub.load_glue("rte", str(glue_dir), cache_dir=cache)
    assert set(rte) == {"train", "dev"}
    assert rows(rte["train"]) == [
        {"idx": 0, "text_a": "A man rides a bike.", "text_b": "A man rides.", "choices": None, "label": 0},
        {"idx": 1, "text_a": "It rains.", "text_b": "It is dry.", "choices": None, "label": 1},
    ]
    assert rows(rte["dev"]) == [{"idx": 0, "text_a": "Dogs bark.", "text_b": "Animals bark.", "choices": None, "label": 0}]
    assert rte["train"].schema == schema(get_task("rte"))

    cola = hub.load_glue("cola", str(glue_dir), cache_dir=cache)
    assert rows(cola["dev"]) == [{"idx": 7, "text_a": "He left.", "text_b": None, "choices": None, "label": 1}]

    stsb = hub.load_glue("stsb", str(glue_dir), cache_dir=cache)
    assert stsb["train"].schema.field("label").type == pa.float64()
    assert stsb["dev"].column("label").to_pylist() == [3.8]  # float32 3.7999999523 -> the published 3.8
    assert stsb["train"].column("label").to_pylist() == [5.0, 0.8]


def test_glue_mnli_has_both_dev_splits_and_no_test(glue_dir, tmp_path):
    mnli = hub.load_glue("mnli", str(glue_dir), cache_dir=str(tmp_path / "cache"))
    assert set(mnli) == {"train", "dev_matched", "dev_mismatched"}
    assert mnli["train"].column("label").to_pylist() == [0, 1, 2]
    assert rows(mnli["dev_mismatched"]) == [
        {"idx": 0, "text_a": "mm", "text_b": "mmh", "choices": None, "label": 1},
        {"idx": 1, "text_a": "mm2", "text_b": "mmh2", "choices": None, "label": 0},
    ]
    assert mnli["dev_matched"].column("text_a").to_pylist() == ["m"]


def test_glue_missing_config_is_a_pipeline_error(glue_dir, tmp_path):
    with pytest.raises(PipelineError, match="no config 'qqp'"):
        hub.load_glue("qqp", str(glue_dir), cache_dir=str(tmp_path / "cache"))


def test_swag_loader(tmp_path):
    def swag(n: int, offset: int) -> pd.DataFrame:
        return pd.DataFrame({
            "video-id": [f"v{i}" for i in range(n)], "fold-ind": [str(i) for i in range(n)],
            "startphrase": [f"ctx {i + offset} He" for i in range(n)], "sent1": [f"ctx {i + offset}" for i in range(n)],
            "sent2": ["He"] * n, "gold-source": ["gold"] * n,
            **{f"ending{k}": [f"e{k} {i + offset}" for i in range(n)] for k in range(4)},
            "label": [(i + offset) % 4 for i in range(n)],
        })
    test = swag(1, 99).assign(label=-1)
    root = write_hub_repo(tmp_path / "swag", {"regular": {"train": swag(3, 0), "validation": swag(2, 10), "test": test},
                                              "full": {"train": swag(1, 50)}})
    out = hub.load_swag(str(root), cache_dir=str(tmp_path / "cache"))
    assert set(out) == {"train", "dev"}
    assert rows(out["dev"]) == [
        {"idx": 0, "text_a": "ctx 10", "text_b": "He", "choices": ["e0 10", "e1 10", "e2 10", "e3 10"], "label": 2},
        {"idx": 1, "text_a": "ctx 11", "text_b": "He", "choices": ["e0 11", "e1 11", "e2 11", "e3 11"], "label": 3},
    ]
    assert out["train"].num_rows == 3 and out["train"].schema == schema(get_task("swag"))


def kaggle_csv(path: Path, n: int = 40) -> pd.DataFrame:
    df = pd.DataFrame({
        "id": [f"{i:09x}" for i in range(n)],
        "url_legal": ["" if i % 3 else "https://example.org/x" for i in range(n)],
        "license": ["" if i % 3 else "CC BY 4.0" for i in range(n)],
        "excerpt": [f"Passage number {i}.\nIt has two lines." for i in range(n)],
        "target": np.round(np.linspace(-3.5, 1.5, n), 6),
        "standard_error": np.full(n, 0.48),
    })
    df.to_csv(path, index=False)
    return df


def test_read_loader_splits_kaggle_train_csv_deterministically(tmp_path):
    df = kaggle_csv(tmp_path / "train.csv")
    out = hub.load_read(str(tmp_path / "train.csv"), dev_fraction=0.1, seed=0)
    assert (out["train"].num_rows, out["dev"].num_rows) == (36, 4)
    idx = out["train"].column("idx").to_pylist() + out["dev"].column("idx").to_pylist()
    assert sorted(idx) == list(range(40))  # a partition of train.csv's rows
    for r in rows(out["dev"]) + rows(out["train"]):
        assert r["text_a"] == df.excerpt[r["idx"]] and r["label"] == pytest.approx(df.target[r["idx"]], abs=0)
        assert r["text_b"] is None and r["choices"] is None
    again = hub.load_read(str(tmp_path / "train.csv"), dev_fraction=0.1, seed=0)
    assert again["dev"].equals(out["dev"])
    other = hub.load_read(str(tmp_path / "train.csv"), dev_fraction=0.1, seed=1)
    assert other["dev"].column("idx").to_pylist() != out["dev"].column("idx").to_pylist()


def test_read_loader_errors(tmp_path):
    with pytest.raises(PipelineError, match="read_path"):
        hub.load_read("")
    with pytest.raises(PipelineError, match=r"missing .*missing.csv \(`tasks.read_path`\): download train.csv"):
        hub.load_read(str(tmp_path / "missing.csv"))
    pd.DataFrame({"id": ["a"], "text": ["x"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(PipelineError, match="excerpt"):
        hub.load_read(str(tmp_path / "bad.csv"))


@pytest.mark.parametrize("damage, message", [
    (lambda text: text.replace("-3.5,", "abc,", 1), r"the row ending on line 3: .* target 'abc'"),
    (lambda text: text.replace("-3.5,", ",", 1), r"the row ending on line 3: .* target ''"),
    (lambda text: text.replace("-3.5,", "nan,", 1), r"the row ending on line 3: .* target 'nan'"),
    (lambda text: text.replace('"Passage number 0.', '"', 1).replace("It has two lines.", "", 1), r"got excerpt '\\n'"),
    (lambda text: text[:text.index("Passage number 5") + 8], "is not a readable CSV file: unexpected end of data"),
])
def test_a_damaged_commonlit_file_is_refused_before_any_download(tmp_path, damage, message):
    """The check the first stage and `xdbert fetch` run reads every row: a bad one is one line, not a traceback
    from the tasks stage after GLUE's and SWAG's downloads."""
    from xdbert.data.provided import check_read_csv

    path = tmp_path / "train.csv"
    kaggle_csv(path)
    check_read_csv(path)
    path.write_text(damage(path.read_text()))
    with pytest.raises(PipelineError, match=r"train.csv \(`tasks.read_path`\)" + r".*" + message):
        check_read_csv(path)


def test_offline_hub_requests_say_what_to_do(tmp_path):
    # conftest sets HF_HUB_OFFLINE=1; the real ids must fail at once with the instructions
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE=1"):
        hub.load_glue("rte", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(PipelineError, match="HF_HUB_OFFLINE=1"):
        hub.load_swag(cache_dir=str(tmp_path / "cache"))


# ------------------------------------------------------------------------------------------------
# Generated stand-ins: schema, determinism, balance
# ------------------------------------------------------------------------------------------------

def test_generated_schema_sizes_and_balance(generated):
    for name, splits in generated.items():
        spec = get_task(name)
        assert set(splits) == set(spec.splits)
        for split, table in splits.items():
            assert table.schema == schema(spec)
            assert table.num_rows == (TRAIN if split == "train" else DEV)
            assert table.column("idx").to_pylist() == list(range(table.num_rows))
            df = frame(table)
            assert df.text_b.isna().all() == (not spec.pair)
            if spec.kind == "multiple_choice":
                assert all(len(c) == 4 and len(set(c)) == 4 for c in df.choices)
            else:
                assert df.choices.isna().all()
            if spec.kind == "classification" or spec.kind == "multiple_choice":
                counts = Counter(df.label)
                assert sorted(counts) == list(range(spec.num_labels))
                assert max(counts.values()) - min(counts.values()) <= 1  # balanced
        train_keys = {(a, b) for a, b in zip(frame(splits["train"]).text_a, frame(splits["train"]).text_b.fillna(""))}
        for split in spec.dev_splits:
            dev_keys = {(a, b) for a, b in zip(frame(splits[split]).text_a, frame(splits[split]).text_b.fillna(""))}
            if name != "swag":
                assert not train_keys & dev_keys, f"{name}: dev repeats train"
    assert frame(generated["stsb"]["train"]).label.between(0, 5).all()
    assert sorted(Counter(frame(generated["stsb"]["train"]).label.round()).values())[0] >= 80  # all grades present


def test_generated_is_deterministic():
    for name in ("mrpc", "swag", "read", "mnli"):
        a, b = generate_task(name, 50, 20, seed=1), generate_task(name, 50, 20, seed=1)
        assert all(a[s].equals(b[s]) for s in a)
        c = generate_task(name, 50, 20, seed=2)
        assert not a["train"].equals(c["train"])


def test_generated_bad_sizes():
    with pytest.raises(PipelineError, match="tasks.train_size"):
        generate_task("rte", 0, 10, 0)
    with pytest.raises(PipelineError, match="tasks.dev_size"):
        generate_task("rte", 10, -5, 0)


def test_a_generator_out_of_new_examples_is_an_error_not_a_repeat(monkeypatch):
    """Dev examples never repeat a train example: a stand-in that can only repeat itself says so."""
    from xdbert.data.synthetic import tasks

    few = lambda rng, y, objects: (f"premise {rng.randrange(3)}", "hypothesis", None, y)  # noqa: E731  (3 distinct texts)
    monkeypatch.setitem(tasks.GENERATORS, "rte", few)
    assert len(generate_task("rte", 2, 1, 0)["dev"]) == 1  # the 3 there are
    with pytest.raises(PipelineError, match="the rte stand-in drew 200 repeats .* after 3: .* lower them"):
        generate_task("rte", 2, 2, 0)


def test_tasks_use_the_corpus_vocabulary(generated):
    """Every word of every task occurs in the generated corpus: the pretrained tiny model has seen them all."""
    seen = {w for d in generate_corpus(300, 30, 0)["train"] for w in re.findall(r"[a-z]+", d.lower())}
    unseen = Counter()
    for name, splits in generated.items():
        for table in splits.values():
            df = frame(table)
            texts = list(df.text_a) + list(df.text_b.dropna()) + [e for c in df.choices.dropna() for e in c]
            unseen.update(w for t in texts for w in re.findall(r"[a-z]+", t.lower()) if w not in seen)
    assert sum(unseen.values()) < 0.001 * 200_000, unseen.most_common(10)


# ------------------------------------------------------------------------------------------------
# The labels are true of the texts
# ------------------------------------------------------------------------------------------------

FUNCTION = {"the", "a", "an", "was", "were", "by", "in", "on", "at", "did", "not", "it"}
LEMMA = {f: v.base for v in VERBS for f in (v.base, v.s, v.past, v.pp, v.ing)}


def content(text: str) -> Counter:
    """Content lemmas with synonyms folded, so re-wordings compare equal."""
    out = Counter()
    for w in re.findall(r"[a-z]+|\d+", text.lower()):
        if w in FUNCTION:
            continue
        w = LEMMA.get(w, w)
        syn = SYNONYM_FORMS.get(w)
        out[LEMMA.get(min(w, syn), min(w, syn)) if syn else w] += 1
    return out


def test_mrpc_paraphrases_state_the_same_content(generated):
    df = frame(generated["mrpc"]["train"])
    same = [content(a) == content(b) for a, b in zip(df.text_a, df.text_b)]
    pos = [s for s, y in zip(same, df.label) if y == 1]
    neg_negation = [("not" in b.split()) != ("not" in a.split()) for a, b, y in zip(df.text_a, df.text_b, df.label) if y == 0]
    assert all(pos)
    # a non-paraphrase changes content, or negates one side only
    assert all((not s) or n for s, n in zip([s for s, y in zip(same, df.label) if y == 0], neg_negation))


def test_rte_entailed_hypotheses_only_restate_the_premise(generated):
    df = frame(generated["rte"]["train"])
    for a, b, y in zip(df.text_a, df.text_b, df.label):
        if y == 0:
            assert not content(b) - content(a), (a, b)
            assert "not" not in b.split() and "nobody" not in b.lower()


def test_stsb_score_tracks_shared_content(generated):
    df = frame(generated["stsb"]["train"])
    overlap = [sum((content(a) & content(b)).values()) for a, b in zip(df.text_a, df.text_b)]
    assert np.corrcoef(overlap, df.label)[0, 1] > 0.8
    five = df[df.label.round() == 5]
    assert all(content(a) == content(b) for a, b in zip(five.text_a, five.text_b))


def test_swag_gold_ending_is_what_the_object_is_for(generated):
    for row in frame(generated["swag"]["train"]).itertuples():
        obj = next(o for o in AFFORDANCES if re.search(rf"\b{o}\b", row.text_a))
        group = AFFORDANCES[obj][0]
        fits = {p for o, (g, ps) in AFFORDANCES.items() if g == group for p in ps}

        def plain(ending: str) -> str:
            return re.sub(rf"\bthe {obj}\b", "it", ending.rstrip("."), count=1)
        assert plain(row.choices[row.label]) in fits
        assert all(plain(e) not in fits for i, e in enumerate(row.choices) if i != row.label)


def test_cola_negatives_are_not_grammatical_sentences(generated):
    """A broken sentence has a word pair never seen in 3000 grammatical ones, or no verb at all."""
    rng = random.Random("cola-reference")
    good = [gen_cola(rng, 1)[0] for _ in range(3000)]
    bigrams = {b for s in good for b in zip(s.lower().split(), s.lower().split()[1:])}
    verbs = set(LEMMA) | {f for v in INTRANSITIVE for f in (v.base, v.s, v.past, v.pp, v.ing)} | {"is", "are", "was", "were", "has", "have"}
    df = frame(generated["cola"]["dev"])
    for s in df[df.label == 0].text_a:
        words = s.lower().rstrip(".").split()
        assert set(zip(words, words[1:])) - bigrams or not set(words) & verbs, s
    assert set(df[df.label == 1].text_a) <= set(good) | set(df[df.label == 1].text_a)


def test_read_target_is_a_function_of_readability(generated):
    df = frame(generated["read"]["train"])
    expected = np.array([readability_target(readability_features(t)) for t in df.text_a])
    assert np.abs(df.label.to_numpy() - expected).max() < 6 * READ_NOISE
    wps = np.array([readability_features(t)["words_per_sentence"] for t in df.text_a])
    assert np.corrcoef(wps, df.label)[0, 1] < -0.5  # longer sentences, harder text
    assert -4 < df.label.min() and df.label.max() < 2.5  # CommonLit's range


def test_mnli_mismatched_is_another_genre(generated):
    train = " ".join(frame(generated["mnli"]["train"]).text_a).lower().split()
    mismatched = " ".join(frame(generated["mnli"]["dev_mismatched"]).text_a).lower().split()
    matched = " ".join(frame(generated["mnli"]["dev_matched"]).text_a).lower().split()
    assert "i" not in train and "i" not in matched
    assert Counter(mismatched)["i"] > 50


# ------------------------------------------------------------------------------------------------
# Learnability: simple baselines are clearly above chance on every generated dev split
# ------------------------------------------------------------------------------------------------

WORD = re.compile(r"[a-z0-9]+")
STOP = {"the", "a", "an", "was", "were", "by", "in", "on", "at", "of", "and", "to", "it", "did", "is", "are"}


def words(t) -> list[str]:
    return WORD.findall(t.lower()) if isinstance(t, str) else []


def overlap_features(a: str, b: str) -> list[float]:
    A, B = {w for w in words(a) if w not in STOP}, {w for w in words(b) if w not in STOP}
    return [len(A & B) / max(1, len(A | B)), len(B - A), len(A - B), len(A & B)]


def pair_text(df: pd.DataFrame) -> list[str]:
    # segment-aware bag of words: the second text's words are marked, like BERT's token types
    return [f"{a} {' '.join('b_' + w for w in words(b))}" for a, b in zip(df.text_a, df.text_b)]


def question_cross(df: pd.DataFrame) -> list[list[str]]:
    # question word x sentence word: "where" pairs with place words, "how many" with numbers
    return [[f"{q}|{w}" for q in words(a)[:2] for w in set(words(b))] for a, b in zip(df.text_a, df.text_b)]


def baseline_scores(name: str, splits: dict[str, pa.Table]) -> dict[str, float]:
    spec = get_task(name)
    train = frame(splits["train"])
    out = {}
    if spec.kind == "multiple_choice":
        hasher = FeatureHasher(2 ** 16, input_type="string")

        def expand(df):  # one (context word x ending word) bag per choice
            return hasher.transform([[f"{c}|{e}" for c in set(words(r.text_a)) - STOP for e in words(end)]
                                     for r in df.itertuples() for end in r.choices])
        y = np.array([int(i == r.label) for r in train.itertuples() for i in range(4)])
        model = LogisticRegression(max_iter=2000, solver="liblinear").fit(expand(train), y)
        for split in spec.dev_splits:
            dev = frame(splits[split])
            scores = model.decision_function(expand(dev)).reshape(-1, 4)
            out[split] = compute_metrics(name, scores, dev.label)[spec.metric]
        return out

    def features(df, fit=None):
        text = pair_text(df) if spec.pair else list(df.text_a)
        # word pairs matter for grammar and sentiment; pair tasks rely on segment-aware words + overlap
        vec = fit or CountVectorizer(ngram_range=(1, 1) if spec.pair else (1, 2)).fit(text)
        parts = [vec.transform(text)]
        if spec.pair:
            parts.append(csr_matrix(np.array([overlap_features(a, b) for a, b in zip(df.text_a, df.text_b)])))
        if name == "qnli":
            parts.append(FeatureHasher(2 ** 16, input_type="string").transform(question_cross(df)))
        return hstack(parts).tocsr(), vec

    X, vec = features(train)
    solver = "liblinear" if spec.num_labels == 2 else "lbfgs"  # liblinear: binary only, and fast on wide sparse X
    model = (Ridge() if spec.kind == "regression" else LogisticRegression(max_iter=3000, solver=solver)).fit(X, train.label)
    for split in spec.dev_splits:
        dev = frame(splits[split])
        out[split] = compute_metrics(name, model.predict(features(dev, vec)[0]), dev.label)[spec.metric]
    return out


# chance: accuracy 1/k, F1 of a coin 0.5, Matthews/Spearman 0; READ: the dev standard deviation
CLEARLY_ABOVE_CHANCE = {"rte": 0.65, "mrpc": 0.7, "stsb": 0.5, "cola": 0.15, "sst2": 0.7, "qnli": 0.62, "qqp": 0.7,
                        "mnli": 0.5, "swag": 0.5}


def test_simple_baselines_learn_every_generated_task(generated):
    for name in TASK_NAMES:
        scores = baseline_scores(name, generated[name])
        if name == "read":
            std = frame(generated[name]["dev"]).label.std(ddof=0)
            assert scores["dev"] < 0.6 * std, (scores, std)
        else:
            for split, value in scores.items():
                assert value > CLEARLY_ABOVE_CHANCE[name], (name, split, value)


# ------------------------------------------------------------------------------------------------
# The stage
# ------------------------------------------------------------------------------------------------

VIS_SIZES = {"train": 48, "f_plus": 32, "f_zero": 16, "t": 16}


def run_stage(cwd: Path, mechanism: bool = False, **overrides) -> subprocess.CompletedProcess:
    params = {"profile": "embedded", "tasks": {**values("embedded")["tasks"], "source": "generated",
                                               "names": ["rte", "mnli", "swag", "read"], "train_size": 30,
                                               "train_sizes": {}, "dev_size": 12, "read_path": "", "seed": 0},
              "mechanism": {**values("embedded")["mechanism"], "enabled": mechanism, "control_task": "rte", "vis": VIS_SIZES}}
    params["tasks"].update(overrides)
    (cwd / "params.yaml").write_text(yaml.safe_dump(params))
    return subprocess.run([sys.executable, str(ROOT / "stages" / "tasks.py")], cwd=cwd, capture_output=True, text=True)


def test_stage_writes_every_task_and_summary(tmp_path):
    r = run_stage(tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "data" / "tasks"
    assert sorted(p.name for p in out.iterdir()) == ["mnli", "read", "rte", "summary.json", "swag"]
    assert sorted(p.name for p in (out / "mnli").iterdir()) == ["dev_matched.parquet", "dev_mismatched.parquet", "train.parquet"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == "generated"
    assert summary["tasks"]["rte"]["splits"]["dev"] == {"size": 12, "label": {"entailment": 6, "not_entailment": 6}}
    assert summary["tasks"]["mnli"]["splits"]["train"]["label"] == {"entailment": 10, "neutral": 10, "contradiction": 10}
    assert set(summary["tasks"]["read"]["splits"]["dev"]["label"]) == {"mean", "std", "min", "max"}
    table = pq.read_table(out / "swag" / "train.parquet")
    assert table.schema == schema(get_task("swag"))
    assert table.equals(generate_task("swag", 30, 12, 0)["train"])


def test_stage_writes_vis_and_its_dev_kinds_with_the_study_on(tmp_path):
    r = run_stage(tmp_path, mechanism=True, seed=3)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "data" / "tasks"
    assert sorted(p.name for p in (out / "vis").iterdir()) == ["dev.parquet", "dev_kinds.parquet", "train.parquet"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["vis"]["splits"]["train"]["size"] == 48
    assert "vis" in r.stdout
    dev, train = pq.read_table(out / "vis" / "dev.parquet"), pq.read_table(out / "vis" / "train.parquet")
    assert dev.schema == schema(get_task("vis")) and (train.num_rows, dev.num_rows) == (48, 64)
    kinds = pq.read_table(out / "vis" / "dev_kinds.parquet")
    assert kinds.schema == pa.schema([("idx", pa.int64()), ("kind", pa.string()), ("object", pa.string())])
    assert kinds.column("idx").to_pylist() == dev.column("idx").to_pylist()
    rows = kinds.to_pandas().assign(label=dev.column("label").to_numpy(), text=dev.column("text_a").to_pylist())
    assert rows.kind.value_counts().to_dict() == {"F+": 32, "F0": 16, "T=": 8, "T!=": 8}
    for kind, group in rows.groupby("kind"):  # labels as even as each kind's size allows: 4 words
        assert sorted(group.label.value_counts().reindex(range(4), fill_value=0)) == [len(group) // 4] * 4, kind
    words = dict(enumerate(PATTERNS))
    for _, row in rows.iterrows():  # the object is the one the sentence names; T rows state their label's word
        assert re.search(rf"\b{row.object}", row.text), (row.object, row.text)
        stated = [w for w in PATTERNS if re.search(rf"\b{w}\b", row.text)]
        assert stated == ([words[row.label]] if row.kind.startswith("T") else []), row.text
    facts = MechanismSettings.from_params({**values("embedded"), "tasks": {**values("embedded")["tasks"], "names": ["rte"]},
                                           "mechanism": {**values("embedded")["mechanism"], "control_task": "rte"}}).facts()
    for _, row in rows[rows.kind != "T!="].iterrows():  # F+, F0 and T= are labelled with the object's fact
        assert words[row.label] == facts.real[row.object], row.text
    assert set(rows[rows.kind == "F+"].object) <= {o for o, s in facts.split.items() if s == "dev_captioned"}
    assert set(rows[rows.kind == "F0"].object) <= {o for o, s in facts.split.items() if s == "dev_uncaptioned"}


def test_stage_with_the_study_off_writes_no_vis(tmp_path):
    r = run_stage(tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "data" / "tasks" / "vis").exists()
    assert "vis" not in json.loads((tmp_path / "data" / "tasks" / "summary.json").read_text())["tasks"]


def test_stage_train_sizes_override_one_task_and_leave_the_others_byte_identical(tmp_path):
    """A per-task size changes that task only, so DVC reruns only its finetunes."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run_stage(tmp_path / "a").returncode == 0
    r = run_stage(tmp_path / "b", train_sizes={"rte": 50})
    assert r.returncode == 0, r.stderr
    a, b = tmp_path / "a" / "data" / "tasks", tmp_path / "b" / "data" / "tasks"
    assert pq.read_table(b / "rte" / "train.parquet").num_rows == 50
    assert pq.read_table(b / "rte" / "dev.parquet").num_rows == 12
    for name in ("mnli", "swag", "read"):
        for split in (a / name).iterdir():
            assert split.read_bytes() == (b / name / split.name).read_bytes(), split


def tasks_params(**overrides) -> dict:
    params = values("embedded")
    params["tasks"].update(overrides)
    return params


def test_settings_keep_only_the_keys_of_their_source_and_check_every_key():
    s = TasksSettings.from_params(values("embedded"))
    assert (s.source, s.names, s.seed) == ("generated", TASK_NAMES, 0)
    assert (s.train_size, s.train_sizes, s.dev_size) == (500, {"qnli": 2000, "swag": 1000}, 200)
    assert s.glue_hub_id is None and s.read_path is None  # hub keys are not kept for generated tasks
    hub = TasksSettings.from_params(tasks_params(source="hub", names=["rte", "read"], read_path="train.csv"))
    assert (hub.glue_hub_id, hub.swag_hub_id, hub.read_path, hub.read_dev_fraction) == ("nyu-mll/glue", None, "train.csv", 0.1)
    assert hub.train_size is None
    # a key the source does not read is checked all the same: the error shows before a switch of source
    with pytest.raises(PipelineError, match="`tasks.train_size` must be a positive integer; got 0"):
        TasksSettings.from_params(tasks_params(source="hub", train_size=0))
    with pytest.raises(PipelineError, match="`tasks.read_dev_fraction` must be a number between 0 and 1"):
        TasksSettings.from_params(tasks_params(read_dev_fraction=2))
    with pytest.raises(PipelineError, match="`tasks.swag_hub_id` must be a non-empty string"):
        TasksSettings.from_params(tasks_params(source="hub", names=["rte"], swag_hub_id=None))


SETTINGS_ERRORS = [
    ({"names": ["rte", "wnli"]}, "allowed: rte, mrpc, stsb, cola, sst2, qnli, qqp, mnli, swag, read"),
    ({"names": []}, "`tasks.names` is empty"),
    ({"names": ["rte", "rte"]}, "twice"),
    ({"seed": -1}, "`tasks.seed` must be a non-negative integer"),
    ({"train_size": 0}, "tasks.train_size"),
    ({"train_sizes": {"wnli": 40}}, "entry of `tasks.train_sizes`"),
    ({"train_sizes": {"rte": -1}}, "tasks.train_sizes.rte"),
    ({"train_sizes": [40]}, "tasks.train_sizes"),
    ({"dev_size": -3}, "tasks.dev_size"),
    ({"dev_size": None}, "tasks.dev_size"),
    ({"source": "kaggle"}, "tasks.source"),
    ({"source": "hub", "names": ["read"], "read_dev_fraction": 0.1}, "`tasks.read_path` is empty"),
    ({"source": "hub", "names": ["read"], "read_path": "x.csv", "read_dev_fraction": 1}, "tasks.read_dev_fraction"),
    ({"source": "hub", "names": ["rte"], "glue_hub_id": ""}, "`tasks.glue_hub_id` must be a non-empty string"),
    ({"source": "hub", "names": ["swag"], "swag_hub_id": " "}, "`tasks.swag_hub_id` must be a non-empty string"),
]


@pytest.mark.parametrize("overrides, message", SETTINGS_ERRORS)
def test_settings_errors_name_the_key(overrides, message):
    with pytest.raises(PipelineError) as e:
        TasksSettings.from_params(tasks_params(**overrides))
    assert message in str(e.value)


def test_settings_missing_key_or_section():
    params = values("embedded")
    del params["tasks"]["dev_size"]
    with pytest.raises(PipelineError, match="missing param `tasks.dev_size`"):
        TasksSettings.from_params(params)
    with pytest.raises(PipelineError, match="no section `tasks`"):
        TasksSettings.from_params({"profile": "embedded"})


STAGE_ERRORS = [
    ({"names": ["rte", "rte"]}, "twice"),  # a settings error
    ({"source": "hub", "names": ["rte"], "glue_hub_id": "nyu-mll/glue"}, "HF_HUB_OFFLINE=1"),  # a loading error
]


def test_stage_errors_leave_existing_tasks_intact(tmp_path):
    ok = run_stage(tmp_path)
    assert ok.returncode == 0, ok.stderr
    before = (tmp_path / "data" / "tasks" / "rte" / "train.parquet").read_bytes()
    for overrides, message in STAGE_ERRORS:
        r = run_stage(tmp_path, **overrides)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (overrides, r.stderr)
        assert (tmp_path / "data" / "tasks" / "rte" / "train.parquet").read_bytes() == before
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["tasks"]  # no temp directory left


def test_stage_hub_source_from_local_copies(tmp_path, glue_dir):
    kaggle_csv(tmp_path / "train.csv", n=20)
    r = run_stage(tmp_path, source="hub", names=["rte", "mnli", "read"], glue_hub_id=str(glue_dir),
                  read_path=str(tmp_path / "train.csv"), read_dev_fraction=0.25)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "data" / "tasks"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == "hub"
    assert summary["tasks"]["read"]["splits"]["dev"]["size"] == 5
    assert summary["tasks"]["mnli"]["splits"]["dev_mismatched"]["size"] == 2
    assert pq.read_table(out / "rte" / "train.parquet").column("text_b").to_pylist() == ["A man rides.", "It is dry."]
