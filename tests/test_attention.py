"""Cross-attention analysis: per-head alignment accuracy, its baselines, and the heatmap PNG."""
import numpy as np
import pytest

from xdbert.analysis import attention as A
from xdbert.errors import PipelineError
from xdbert.paths import crossmodal
from xdbert.profiles import values

# One window. BERT: [CLS] tok1 tok2 [SEP] [PAD]; CLIP: <sot> c1 c2 c3 <eot> pad.
START = np.array([[-1, 1, 2, -1, -1]])
END = np.array([[-1, 2, 3, -1, -1]])
QMASK = np.array([[1, 1, 1, 1, 0]], bool)
KMASK = np.array([[1, 1, 1, 1, 1, 0]], bool)


def hand_attention():
    attn = np.full((1, 2, 5, 6), 1 / 6)
    attn[0, 0, 1] = [0.1, 0.6, 0.1, 0.1, 0.1, 0.0]   # head 0, tok1 -> c1: inside [1, 2)
    attn[0, 0, 2] = [0.1, 0.1, 0.5, 0.2, 0.1, 0.0]   # head 0, tok2 -> c2: inside [2, 3)
    attn[0, 1, 1] = [0.5, 0.2, 0.1, 0.1, 0.1, 0.0]   # head 1, tok1 -> <sot>: miss
    attn[0, 1, 2] = [0.1, 0.0, 0.3, 0.0, 0.0, 0.6]   # head 1, tok2: padding is the max but masked -> c2: hit
    attn[0, 1, 0] = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]   # specials and padding queries are never counted
    return attn


def test_argmax_hits_on_hand_made_attention():
    hits, mass, n = A.argmax_hits(hand_attention(), START, END, QMASK, KMASK)
    assert n == 2
    assert hits.tolist() == [2, 1]
    np.testing.assert_allclose(mass, [0.6 + 0.5, 0.2 + 0.3])


def test_baselines_on_hand_made_case():
    # chance: each counted token's range holds 1 of the 5 valid CLIP positions
    assert A.chance_hits(START, END, QMASK, KMASK) == pytest.approx(2 / 5)
    # diagonal: 4 real BERT positions onto 5 valid CLIP positions: ranks 0,1,2,3 -> 0,1,3,4
    assert A.diagonal_targets(QMASK, KMASK).tolist() == [[0, 1, 3, 4, -1]]
    assert A.diagonal_hits(START, END, QMASK, KMASK) == 1  # tok1 -> c1 hits; tok2 -> c3 misses [2, 3)


def brute_force(attn, start, end, qmask, kmask):
    b, h, l, c = attn.shape
    hits, mass, n = np.zeros(h), np.zeros(h), 0
    for i in range(b):
        for q in range(l):
            if not qmask[i, q] or start[i, q] < 0 or end[i, q] <= start[i, q]:
                continue
            n += 1
            for head in range(h):
                valid = [k for k in range(c) if kmask[i, k]]
                top = max(valid, key=lambda k: attn[i, head, q, k])
                hits[head] += start[i, q] <= top < end[i, q]
                mass[head] += attn[i, head, q, start[i, q]:end[i, q]].sum()
    return hits, mass, n


def test_argmax_hits_match_brute_force_on_random_windows():
    rng = np.random.default_rng(0)
    b, h, l, c = 3, 4, 12, 20
    attn = rng.dirichlet(np.ones(c), size=(b, h, l))
    start = rng.integers(-1, c - 3, size=(b, l))
    end = np.where(start >= 0, start + rng.integers(0, 3, size=(b, l)), -1)
    qmask = rng.random((b, l)) < 0.8
    kmask = rng.random((b, c)) < 0.9
    hits, mass, n = A.argmax_hits(attn, start, end, qmask, kmask)
    ref_hits, ref_mass, ref_n = brute_force(attn, start, end, qmask, kmask)
    assert n == ref_n and hits.tolist() == ref_hits.tolist()
    np.testing.assert_allclose(mass, ref_mass)


def test_stats_accumulate_layers_and_batches():
    stats = A.AlignmentStats(layers=2, heads=2)
    attn = hand_attention()
    uniform = np.full_like(attn, 1 / 6)
    for _ in range(2):
        stats.add([attn, uniform], START, END, QMASK, KMASK)
    t = stats.table()
    assert t["tokens"] == 4 and t["windows"] == 2
    assert t["accuracy"][0] == [1.0, 0.5]
    assert t["chance"] == pytest.approx(0.2) and t["diagonal"] == pytest.approx(0.5)
    md = A.markdown_table(t, "xdbert")
    assert "| 1 | 100.0 <sub>(55.0)</sub> | 50.0 <sub>(25.0)</sub> | 100.0 | 75.0 |" in md
    assert "chance 20.0%, diagonal 50.0%" in md


def test_heatmap_writes_png(tmp_path):
    m = np.random.default_rng(1).dirichlet(np.ones(6), size=5)
    path = A.plot_heatmap(m, ["[CLS]", "dog", "##s", "run", "[SEP]"], ["<sot>", "dogs", "run", ".", "x", "<eot>"],
                          "layer 1, head 0", tmp_path / "map.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    with pytest.raises(ValueError, match="does not match"):
        A.plot_heatmap(m, ["a"], ["b"], "t", tmp_path / "bad.png")


def test_clip_token_labels_are_readable():
    from xdbert.clip import clip_tokenizer

    tok = clip_tokenizer("xdbert-tiny")
    ids = [tok.sot_token_id] + tok.encode("scientists observed mice") + [tok.eot_token_id]
    assert A.clip_token_labels(ids, tok) == ["<sot>", "scientists", "observed", "mice", "<eot>"]


# ----------------------------------------------------------------------------------------------------
# Running a tiny cross-modal model over windows laid out like the shards
# ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
    import torch

    from xdbert.model.modeling import XDBertConfig, XDBertModel

    torch.manual_seed(0)
    cfg = XDBertConfig(encoder="random:bert", vocab_size=60, clip="xdbert-tiny", clip_heads=2, clip_blocks=2,
                       encoder_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                                       "intermediate_size": 64, "max_position_embeddings": 32})
    return XDBertModel.build(cfg).eval()


def fake_windows(n=5, max_len=16, n_blocks=2, seed=0):
    """Windows in the shards' layout: BERT token i (1..k) covers CLIP content token i-1; -1 for specials."""
    from xdbert.clip import clip_special_ids

    sot, eot = clip_special_ids("xdbert-tiny")
    rng = np.random.default_rng(seed)
    rows = {"bert_ids": np.zeros((n, max_len), np.int64), "bert_mask": np.zeros((n, max_len), np.uint8),
            "clip_ids": np.zeros((n, n_blocks * 77), np.int64), "align_start": np.full((n, max_len), -1),
            "align_end": np.full((n, max_len), -1)}
    for w in range(n):
        k = int(rng.integers(3, max_len - 2))
        rows["bert_ids"][w, : k + 2] = [2, *rng.integers(5, 60, size=k), 3]
        rows["bert_mask"][w, : k + 2] = 1
        rows["clip_ids"][w, : k + 2] = [sot, *rng.integers(300, 40000, size=k), eot]
        rows["align_start"][w, 1: k + 1] = np.arange(1, k + 1)
        rows["align_end"][w, 1: k + 1] = np.arange(2, k + 2)
    return rows, eot


class Windows(dict):
    def __getitem__(self, index):
        if isinstance(index, str):
            return dict.__getitem__(self, index)
        return {k: v[index] for k, v in self.items()}


def test_alignment_over_windows_is_independent_of_batching(tiny_model):
    rows, eot = fake_windows()
    windows = Windows(rows)
    one = A.alignment_over_windows(tiny_model, windows, 5, 5, eot).table()
    batched = A.alignment_over_windows(tiny_model, windows, 5, 2, eot).table()
    assert one["tokens"] == int(sum(rows["bert_mask"][w].sum() - 2 for w in range(5)))  # specials never count
    assert one["windows"] == 5 and np.asarray(one["accuracy"]).shape == (2, 4)  # 2 cross layers, 4 heads
    np.testing.assert_allclose(batched["accuracy"], one["accuracy"])
    np.testing.assert_allclose(batched["mass"], one["mass"], rtol=1e-5)
    # each token's range is 1 of its window's k + 2 valid CLIP positions
    k = rows["bert_mask"].sum(axis=1) - 2
    assert one["chance"] == pytest.approx(float(np.sum(k / (k + 2)) / k.sum()))
    assert 0 <= min(map(min, one["accuracy"])) and max(map(max, one["accuracy"])) <= 1


def test_example_heatmaps_one_png_per_layer_and_kind(tiny_model, tmp_path):
    import torch

    rows, eot = fake_windows(n=1)
    ids = torch.as_tensor(rows["clip_ids"]).reshape(1, 2, 77)
    att = A.language_cross_attentions(tiny_model, torch.as_tensor(rows["bert_ids"]), torch.as_tensor(rows["bert_mask"].astype(np.int64)), ids)
    assert len(att) == 2 and att[0].shape == (1, 4, 16, 154)
    np.testing.assert_allclose(att[0].sum(-1), 1.0, rtol=1e-5)
    keys = (ids.reshape(-1) != 0).numpy()
    n_rows, n_cols = 16, int(keys.sum())
    pictures = A.example_heatmaps(att, keys, [f"t{i}" for i in range(n_rows)], [f"c{j}" for j in range(n_cols)], tmp_path, "xdbert")
    assert [(layer, kind) for layer, kind, _ in pictures] == [(1, "head0"), (1, "mean"), (2, "head0"), (2, "mean")]
    for _, _, name in pictures:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------------------
# The `attention` params and the example they name
# ----------------------------------------------------------------------------------------------------

def attention_params(**overrides) -> dict:
    params = values("embedded")
    params["attention"].update(overrides)
    return params


@pytest.fixture
def variants_present(tmp_path, monkeypatch):
    """The working directory holds a (stub) saved cross-modal model of every embedded variant."""
    monkeypatch.chdir(tmp_path)
    for v in values("embedded")["attention"]["variants"]:
        crossmodal("bert", v).mkdir(parents=True)
        (crossmodal("bert", v) / "xdbert_config.json").write_text("{}")


def test_settings_from_the_embedded_profile(variants_present):
    s = A.AttentionSettings.from_params(values("embedded"))
    assert (s.variants, s.family, s.task, s.index) == (("xdbert", "mlm_match"), "bert", "rte", 0)
    assert (s.max_len, s.clip_blocks_per_sentence, s.windows, s.batch_size) == (128, 2, 64, 16)


@pytest.mark.parametrize("overrides, message", [
    ({"variants": []}, "`attention.variants` must be a non-empty list of adapt variants without repeats"),
    ({"variants": ["xdbert", "xdbert"]}, "without repeats"),
    ({"variants": ["xdbert", "one_cross"]},
     "missing models/crossmodal/bert/one_cross/xdbert_config.json: run its adapt stage first (`dvc repro ablate@one_cross`)"),
    ({"variants": ["baseline"]}, "`attention.variants` names 'baseline', which is not an adapt variant with CLIP text "
                                 "(baseline has no cross-modal model, a placeholder no CLIP, a variant with "
                                 "`cross_layers: 0` no cross-attention); allowed: xdbert, mlm_match, mlm, one_cross, two_epochs, "
                                 "nofacts"),
    ({"variants": ["xdbert", "placeholder"]}, "`attention.variants` names 'placeholder', which is not an adapt variant "
                                              "with CLIP text"),
    ({"variants": ["xdbert", "caption_mlm"]}, "`attention.variants` names 'caption_mlm', which is not an adapt variant "
                                              "with CLIP text"),
    ({"task": "swag"}, "`attention.task` must be a sentence or sentence-pair task, not multiple choice"),
    ({"task": "wnli"}, "unknown attention.task 'wnli'; allowed: rte, mrpc"),
    ({"task": ["rte"]}, "unknown attention.task ['rte']"),
    ({"variants": ["xdbert", ["mlm"]]}, "`attention.variants` must be a non-empty list of adapt variants"),
    ({"index": -1}, "`attention.index` must be the integer idx of a dev example; got -1"),
    ({"index": "0"}, "`attention.index` must be the integer idx of a dev example; got '0'"),
    ({"index": True}, "`attention.index` must be the integer idx"),
    ({"windows": 0}, "`attention.windows` must be a positive integer"),
    ({"batch_size": 2.5}, "`attention.batch_size` must be a positive integer"),
])
def test_settings_errors_name_the_key(variants_present, overrides, message):
    with pytest.raises(PipelineError) as e:
        A.AttentionSettings.from_params(attention_params(**overrides))
    assert message in str(e.value)


def test_dev_example_by_idx():
    import pyarrow as pa

    table = pa.table({"idx": [3, 5, 9], "text_a": ["a", "b", "c"]})
    assert A.dev_example(table, 5, "rte", "dev").column("text_a").to_pylist() == ["b"]
    with pytest.raises(PipelineError, match=r"`attention.index: 4` is no idx of rte dev \(idx runs 3..9\)"):
        A.dev_example(table, 4, "rte", "dev")

