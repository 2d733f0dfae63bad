"""PWCCA (paper Table 2): CCA against independent computations, invariances, and the word-set guards."""
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import yaml

from conftest import load_stage
from xdbert.analysis import cca as C
from xdbert.analysis import pwcca as P
from xdbert.errors import PipelineError
from xdbert.paths import PRETRAIN_CLIP, PRETRAIN_ENCODER
from xdbert.profiles import values


def views(n=600, d1=12, d2=8, seed=0, noise=0.5):
    """Two views that share a 4-dimensional latent signal plus independent noise."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 4))
    x = z @ rng.normal(size=(4, d1)) + noise * rng.normal(size=(n, d1))
    y = z @ rng.normal(size=(4, d2)) + noise * rng.normal(size=(n, d2))
    return x, y


def test_identical_views_give_one():
    x, _ = views()
    r = C.pwcca(x, x, eps=0.0)
    assert r.value == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(r.rho, 1.0, atol=1e-9)
    assert r.weights.sum() == pytest.approx(1.0)


def test_invertible_linear_map_gives_one():
    x, _ = views(d1=10)
    a = np.random.default_rng(1).normal(size=(10, 10))
    assert abs(np.linalg.det(a)) > 1e-3
    assert C.pwcca(x, x @ a + 3.0, eps=0.0).value == pytest.approx(1.0, abs=1e-8)
    # the relative ridge keeps this true at the default eps up to its tiny bias
    assert C.pwcca(x, x @ a, eps=1e-8).value == pytest.approx(1.0, abs=1e-5)


def test_scale_of_the_data_does_not_matter():
    x, y = views()
    ref = C.pwcca(x, y, eps=1e-3).value
    assert C.pwcca(1e-3 * x, 1e4 * y, eps=1e-3).value == pytest.approx(ref, rel=1e-9)


def test_independent_noise_is_far_lower():
    x, y = views(n=2000, noise=0.3)
    noise = np.random.default_rng(7).uniform(-1, 1, size=x.shape)
    related, unrelated = C.pwcca(x, y).value, C.pwcca(x, noise).value
    assert related > 0.8
    assert unrelated < 0.15  # ~ sqrt(d / n) for independent views
    assert unrelated < related / 5


def test_one_dimensional_views_give_abs_pearson():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 1))
    y = -0.7 * x + rng.normal(size=(200, 1))
    r = abs(scipy.stats.pearsonr(x[:, 0], y[:, 0])[0])
    assert C.cca(x, y, eps=0.0).rho[0] == pytest.approx(r, abs=1e-12)
    assert C.pwcca(x, y, eps=0.0).value == pytest.approx(r, abs=1e-12)


def direct_cca(x, y):
    """The textbook route: Sxy Syy^-1 Syx a = rho^2 Sxx a, a generalized symmetric eigenproblem."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    sxx, syy, sxy = xc.T @ xc, yc.T @ yc, xc.T @ yc
    m = sxy @ np.linalg.solve(syy, sxy.T)
    w, a = scipy.linalg.eigh(m, sxx)
    order = np.argsort(w)[::-1][: min(x.shape[1], y.shape[1])]
    return np.sqrt(np.clip(w[order], 0, None)), a[:, order], xc


def test_matches_direct_computation():
    x, y = views(n=300, d1=7, d2=5, seed=11)
    rho, a, xc = direct_cca(x, y)
    got = C.cca(x, y, eps=0.0)
    np.testing.assert_allclose(got.rho, rho, atol=1e-10)
    np.testing.assert_allclose(C.pwcca(x, y, eps=0.0, convention="svcca").rho, rho, atol=1e-10)
    # the variates from both routes are the same directions (up to sign)
    h_ref = xc @ a
    h_ref /= np.linalg.norm(h_ref, axis=0)
    h = got.x_variates(x)
    h /= np.linalg.norm(h, axis=0)
    np.testing.assert_allclose(np.abs(np.sum(h * h_ref, axis=0)), 1.0, atol=1e-8)
    # PWCCA weighted by the narrower view y (svcca's convention) = direct projection weights on y
    rho_y, b, ycc = direct_cca(y, x)
    hy = ycc @ b
    hy /= np.linalg.norm(hy, axis=0)
    weights = np.abs(hy.T @ ycc).sum(axis=1)
    weights /= weights.sum()
    res = C.pwcca(x, y, eps=0.0, convention="whitened")
    assert res.weighted_by == "y"
    np.testing.assert_allclose(res.weights, weights, atol=1e-8)
    assert res.value == pytest.approx(float(weights @ rho_y), abs=1e-10)
    assert C.pwcca(x, y, eps=0.0, weight_by="x").weighted_by == "x"


REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "pwcca_reference"


def reference_cases():
    cases = json.loads((REFERENCE / "reference.json").read_text())["cases"]
    return [pytest.param(c, id=f"case{c['case']}-eps{c['epsilon']:g}") for c in cases]


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/pwcca_reference is not beside the checkout")
@pytest.mark.parametrize("case", reference_cases() if REFERENCE.is_dir() else [])
def test_svcca_convention_matches_google_svcca(case):
    """Values google/svcca's compute_pwcca computed on fixed views (../shared/pwcca_reference)."""
    views = np.load(REFERENCE / "views.npz")
    x, y = views[case["x"]], views[case["y"]]
    got = C.pwcca(x, y, eps=case["epsilon"], min_ratio=1, convention="svcca")
    assert len(got.rho) == case["n_coefficients"]
    assert got.value == pytest.approx(case["pwcca"], abs=1e-8)
    assert float(np.mean(got.rho)) == pytest.approx(case["mean_cca"], abs=1e-8)
    # the whitened convention finds the same correlations but weighs them otherwise, by Table 2-sized gaps
    whitened = C.pwcca(x, y, eps=case["epsilon"], min_ratio=1, convention="whitened")
    assert float(np.mean(whitened.rho)) == pytest.approx(case["mean_cca"], abs=1e-4)  # its eps is relative otherwise
    assert abs(whitened.value - case["pwcca"]) > 0.02


def svcca_second_view(x, y):
    """svcca's formula in its own (neurons, data points) layout for the case it cannot run (the second view
    narrower), weighting by the second view's activations as the code intends (svcca PR #9)."""
    a1, a2 = x.T, y.T
    cov = np.cov(a1, a2)
    d1 = len(a1)
    sxx, syy, sxy = cov[:d1, :d1], cov[d1:, d1:], cov[:d1, d1:]
    xm, ym = np.abs(sxx).max(), np.abs(syy).max()
    sxx, syy, sxy = sxx / xm, syy / ym, sxy / np.sqrt(xm * ym)

    def sqrtm(a):
        w, v = np.linalg.eigh(a)
        return v @ np.diag(np.sqrt(w)) @ v.T

    _, s, v = np.linalg.svd(sqrtm(np.linalg.pinv(sxx)) @ sxy @ sqrtm(np.linalg.pinv(syy)))
    means = a2.mean(axis=1, keepdims=True)
    q, _ = np.linalg.qr((v @ (a2 - means) + means).T)
    weights = np.abs(q.T @ a2.T).sum(axis=1)
    return float(np.sum(weights / weights.sum() * s))


def test_svcca_convention_weights_a_narrower_second_view_by_that_view():
    x, y = views(n=400, d1=12, d2=6, seed=5)
    got = C.pwcca(x, y, eps=0.0, convention="svcca")
    assert got.weighted_by == "y" and len(got.weights) == 6
    assert got.value == pytest.approx(svcca_second_view(x, y), abs=1e-10)


def test_unknown_convention_is_refused():
    x, y = views()
    with pytest.raises(ValueError, match="convention must be one of"):
        C.pwcca(x, y, convention="morcos")


def test_too_few_words_names_both_numbers():
    x, y = views(n=50, d1=12, d2=8)
    with pytest.raises(C.TooFewPoints, match=r"50 shared words.*widths 12 and 8.*60 words$"):
        C.pwcca(x, y)
    assert C.pwcca(x, y, min_ratio=4).value > 0  # 50 >= 4 * 12
    # the math knows no params; the stage's library names the one to change
    with pytest.raises(PipelineError, match=r"50 shared words.*widths 12 and 8.*60 words \(param `pwcca.min_words_ratio`\); "
                                            r"use vocabularies that share more whole words, or lower the ratio knowingly$"):
        P.pairwise({"bert": x, "clip": y}, [("bert", "clip")])


def test_shared_words_from_wordpiece_and_clip_bpe():
    bert = {"[CLS]": 0, "[unused3]": 1, "dog": 2, "##s": 3, "cat": 4, "Paris": 5, "42": 6, "run": 7, ".": 8, "café": 9}
    clip = {"dog</w>": 10, "cat": 11, "cat</w>": 12, "run": 13, "paris</w>": 14, "42</w>": 15, "s</w>": 16, ".</w>": 17}
    bw, cw = P.wordpiece_words(bert), P.clip_bpe_words(clip)
    assert bw == {"dog": 2, "cat": 4, "run": 7}
    assert cw == {"dog": 10, "cat": 12, "paris": 14, "s": 16}
    assert P.shared_words({"bert": bw, "clip": cw}) == ["cat", "dog"]
    emb = np.arange(20.0).reshape(10, 2)
    np.testing.assert_array_equal(P.embedding_rows(emb, bw, ["cat", "dog"]), [[8.0, 9.0], [4.0, 5.0]])


def test_no_shared_words_is_a_pipeline_error():
    with pytest.raises(PipelineError, match="share no whole word.*bert: 1 whole words.*clip: 1 whole words"):
        P.shared_words({"bert": {"dog": 1}, "clip": {"cat": 2}})


def test_uniform_noise_is_seeded():
    a, b = P.uniform_noise((30, 4), 1), P.uniform_noise((30, 4), 1)
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -1 and a.max() < 1
    assert not np.array_equal(a, P.uniform_noise((30, 4), 2))


def test_pairwise_rejects_unknown_system():
    x, y = views()
    out = P.pairwise({"bert": x, "clip": y}, [("bert", "clip")])
    assert 0 < out[("bert", "clip")].value < 1
    with pytest.raises(PipelineError, match="unknown PWCCA system 'electra'"):
        P.pairwise({"bert": x}, [("bert", "electra")])


# ----------------------------------------------------------------------------------------------------
# The stage, end to end on local files (a hub family's encoder pointed at a local folder)
# ----------------------------------------------------------------------------------------------------

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


def tiny_study(root: Path, profile: str, families: dict, pairs: list) -> dict:
    """Under `root`: models/tokenizer over 400 words CLIP's BPE also has, the CLIP tower of `pretrain_clip`,
    and params.yaml with `families` and `pwcca.pairs`; returns the params."""
    from transformers import BertTokenizer

    from xdbert.clip import clip_tokenizer
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.saving import save_clip_tower

    clip_words = sorted(P.clip_bpe_words(clip_tokenizer("xdbert-tiny").encoder).items(), key=lambda kv: kv[1])
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##s", "."] + [w for w, _ in clip_words[:400]]
    vocab = {t: i for i, t in enumerate(tokens)}
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(root / "models" / "tokenizer")
    save_clip_tower(CLIPTextTower.build("xdbert-tiny"), root / PRETRAIN_CLIP, "xdbert-tiny")
    params = {
        "profile": profile,
        "model": {"encoder": "random:bert", "encoder_config": TINY, "clip": "xdbert-tiny", "clip_pretrained": "", "seed": 0},
        "families": families,
        "pwcca": {"clip_tower": "", "eps": 1e-6, "convention": "svcca", "weight_by": "smaller", "min_words_ratio": 5,
                  "seed": 0, "pairs": pairs},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return params


def stand_in(root: Path, family: str, encoder: str, config: dict, vocab_size: int) -> None:
    """What pretrain_encoder@<family> leaves for a random: encoder (untrained here: the tests check the table's machinery)."""
    from xdbert.model.encoders import build_masked_lm

    build_masked_lm(encoder, config, vocab_size).save_pretrained(root / PRETRAIN_ENCODER / family)


def test_stage_writes_table2_with_paper_values(tmp_path, monkeypatch):
    from transformers import BertTokenizer, ElectraConfig, ElectraModel

    electra_dir = tmp_path / "electra"
    params = tiny_study(tmp_path, "paper", {
        "bert-b": {"label": "BERT-b", "size": "base", "layer_lr_decay": 1.0},
        "electra-b": {"label": "ELECTRA-b", "encoder": str(electra_dir), "size": "base", "layer_lr_decay": 0.8},
        # not in the pairs, so never loaded: a folder that does not exist would fail the stage
        "electra-l": {"label": "ELECTRA-l", "encoder": str(tmp_path / "absent"), "size": "large", "layer_lr_decay": 0.9},
    }, [["bert-b", "electra-b"], ["bert-b", "clip"], ["electra-b", "clip"], ["bert-b", "random"]])
    vocab = BertTokenizer.from_pretrained(tmp_path / "models" / "tokenizer").get_vocab()
    ElectraModel(ElectraConfig(vocab_size=len(vocab), embedding_size=24, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained(electra_dir)
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(electra_dir)
    stand_in(tmp_path, "bert-b", "random:bert", TINY, len(vocab))
    monkeypatch.chdir(tmp_path)
    load_stage("pwcca").main()

    out = json.loads((tmp_path / "results" / "pwcca.json").read_text())
    assert out["shared_words"] == 400
    assert set(out["pairs"]) == {"bert-b/electra-b", "bert-b/clip", "electra-b/clip", "bert-b/random"}
    assert out["systems"] == {"bert-b": "BERT-b (random:bert)", "electra-b": f"ELECTRA-b ({electra_dir})",
                              "clip": "CLIP (CLIP-T xdbert-tiny)", "random": "RANDOM (U[-1, 1) noise shaped like BERT-b's rows)"}
    pairs = out["pairs"]
    assert pairs["bert-b/clip"]["widths"] == [32, 64]
    assert pairs["electra-b/clip"]["widths"] == [24, 64]  # ELECTRA's embedding width, not its hidden size
    assert {k: r["paper"] for k, r in pairs.items()} == {"bert-b/electra-b": 0.5498, "bert-b/clip": 0.498,
                                                         "electra-b/clip": 0.4645, "bert-b/random": 0.3569}
    assert all(0 < r["pwcca"] < 1 for r in pairs.values())
    md = (tmp_path / "reports" / "table2.md").read_text()
    assert "| BERT-b/CLIP |" in md and "| 0.4980 |" in md and "| ELECTRA-b/CLIP |" in md and "400 shared words" in md
    assert "| BERT-b/ELECTRA-b |" in md and "| BERT-b/RANDOM |" in md and "ELECTRA-l" not in md
    assert out["convention"] == "svcca" and "**svcca** convention: google/svcca's `compute_pwcca`" in md

    params["pwcca"]["min_words_ratio"] = 20  # 400 words < 20 x 64
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="400 shared words.*widths"):
        load_stage("pwcca").main()


def test_stage_compares_two_random_families_through_their_stand_ins(tmp_path, monkeypatch):
    from transformers import AutoModel, BertTokenizer

    from xdbert.clip import clip_tokenizer

    electra_config = {**TINY, "embedding_size": 24}
    tiny_study(tmp_path, "embedded", {
        "bert": {"label": "BERT-tiny", "size": "base", "layer_lr_decay": 1.0},
        "electra": {"label": "ELECTRA-tiny", "encoder": "random:electra", "encoder_config": {"embedding_size": 24},
                    "size": "base", "layer_lr_decay": 0.8},
    }, [["bert", "electra"], ["bert", "clip"], ["electra", "clip"], ["electra", "random"]])
    vocab = BertTokenizer.from_pretrained(tmp_path / "models" / "tokenizer").get_vocab()
    stand_in(tmp_path, "bert", "random:bert", TINY, len(vocab))
    stand_in(tmp_path, "electra", "random:electra", electra_config, len(vocab))
    monkeypatch.chdir(tmp_path)
    load_stage("pwcca").main()

    out = json.loads((tmp_path / "results" / "pwcca.json").read_text())
    pairs = out["pairs"]
    assert out["shared_words"] == 400 and set(pairs) == {"bert/electra", "bert/clip", "electra/clip", "electra/random"}
    assert pairs["bert/electra"]["widths"] == [32, 24]  # the family's own encoder_config, merged over `model`'s
    assert pairs["electra/random"]["widths"] == [24, 32]  # RANDOM is shaped like the first family the pairs name
    assert all(r["paper"] is None for r in pairs.values())  # not the paper profile: no paper column
    # the stand-ins' own embedding rows, over the shared words, are what was compared
    words = P.wordpiece_words(vocab)
    shared = P.shared_words({"bert": words, "clip": P.clip_bpe_words(clip_tokenizer("xdbert-tiny").encoder)})
    rows = {f: P.embedding_rows(AutoModel.from_pretrained(tmp_path / PRETRAIN_ENCODER / f).get_input_embeddings().weight
                                .detach().numpy(), words, shared) for f in ("bert", "electra")}
    assert pairs["bert/electra"]["pwcca"] == pytest.approx(C.pwcca(rows["bert"], rows["electra"]).value, abs=1e-6)
    noise = P.uniform_noise((400, 32), 0)
    assert pairs["electra/random"]["pwcca"] == pytest.approx(C.pwcca(rows["electra"], noise).value, abs=1e-6)
    md = (tmp_path / "reports" / "table2.md").read_text()
    assert "| BERT-tiny/ELECTRA-tiny |" in md and "| ELECTRA-tiny/RANDOM |" in md and "paper |" not in md
    assert ("Systems: BERT-tiny (random:bert); ELECTRA-tiny (random:electra); CLIP (CLIP-T xdbert-tiny); "
            "RANDOM (U[-1, 1) noise shaped like BERT-tiny's rows).") in md

    (tmp_path / PRETRAIN_ENCODER / "electra" / "config.json").unlink()  # pretrain_encoder@electra has not run
    with pytest.raises(PipelineError, match=r"pretrain_encoder/electra.*dvc repro pretrain_encoder@electra"):
        load_stage("pwcca").main()


# ----------------------------------------------------------------------------------------------------
# The `pwcca` params
# ----------------------------------------------------------------------------------------------------

def pwcca_params(profile="embedded", **overrides) -> dict:
    params = values(profile)
    params["pwcca"].update(overrides)
    return params


def test_settings_from_the_embedded_profile():
    s = P.PwccaSettings.from_params(values("embedded"))
    assert s.pairs == (("bert", "clip"), ("bert", "random"), ("clip", "random"))
    assert s.systems == ("bert", "clip", "random") and s.families == ("bert",)
    assert (s.eps, s.weight_by, s.min_words_ratio, s.seed, s.clip_tower) == (1e-6, "smaller", 5.0, 0, "")
    paper = P.PwccaSettings.from_params(values("paper"))
    assert paper.pairs == (("bert-b", "electra-b"), ("bert-b", "clip"), ("electra-b", "clip"), ("bert-b", "random"))
    assert paper.families == ("bert-b", "electra-b")  # electra-l is in no pair: not loaded
    assert paper.convention == "svcca"  # the reference's, as the paper most likely computed Table 2


def test_random_is_shaped_like_the_first_family_the_pairs_name():
    p = pwcca_params("paper", pairs=[["clip", "random"], ["electra-l", "random"], ["bert-b", "electra-l"]])
    assert P.PwccaSettings.from_params(p).families == ("electra-l", "bert-b")
    # no family in the pairs: the study's first, loaded for its shape (and its words)
    assert P.PwccaSettings.from_params(pwcca_params("paper", pairs=[["clip", "random"]])).families == ("bert-b",)


def test_the_paper_values_go_by_the_families_labels():
    r = C.PWCCAResult(0.5, np.ones(2) / 2, np.ones(2), "x", "svcca")
    v = {k: np.zeros((3, 2)) for k in ("b", "e", "l", "clip", "random")}
    labels = P.system_labels({"b": "BERT-b", "e": "ELECTRA-b", "l": "ELECTRA-l"})
    pairs = [("e", "b"), ("clip", "e"), ("b", "random"), ("l", "clip"), ("e", "random")]
    rows = P.table2_rows({pair: r for pair in pairs}, v, 3, labels, paper=True)
    assert [row["paper"] for row in rows] == [0.5498, 0.4645, 0.3569, None, None]  # either order; the paper has no others
    assert all(row["paper"] is None for row in P.table2_rows({pair: r for pair in pairs}, v, 3, labels, paper=False))


@pytest.mark.parametrize("profile, overrides, message", [
    ("embedded", {"pairs": []}, "`pwcca.pairs` must be a non-empty list of [a, b] pairs, each a family of `families` (bert), clip or random"),
    ("embedded", {"pairs": [["bert", "bert"]]}, "entry ['bert', 'bert'] of `pwcca.pairs` must be two different systems, e.g. [bert, clip]"),
    ("embedded", {"pairs": [["bert", "electra-b"]]},
     "unknown system 'electra-b' in `pwcca.pairs`; allowed: a family of `families` (bert), clip or random"),
    ("paper", {"pairs": [["bert-b", "clip"], ["encoder", "electra"]]},
     "unknown system 'encoder' in `pwcca.pairs`; allowed: a family of `families` (bert-b, electra-b, electra-l), clip or random"),
    ("paper", {"pairs": [["bert-b", ["clip"]]]}, "unknown system ['clip'] in `pwcca.pairs`"),
    ("embedded", {"eps": -1}, "`pwcca.eps` must be a number >= 0; got -1"),
    ("embedded", {"eps": "small"}, "`pwcca.eps` must be a number >= 0; got 'small'"),
    ("embedded", {"eps": float("nan")}, "`pwcca.eps` must be a number >= 0; got nan"),
    ("embedded", {"clip_tower": ["models"]}, "`pwcca.clip_tower` must be a saved CLIP tower folder"),
    ("embedded", {"weight_by": "z"}, "unknown pwcca.weight_by 'z'; allowed: x, y, smaller"),
    ("embedded", {"convention": "morcos"}, "unknown pwcca.convention 'morcos'; allowed: svcca, whitened"),
    ("embedded", {"min_words_ratio": 0}, "`pwcca.min_words_ratio` must be a positive number"),
    ("embedded", {"seed": -2}, "`pwcca.seed` must be a non-negative integer"),
    ("embedded", {"clip_tower": "models/nothing"}, "`pwcca.clip_tower: models/nothing` is not a saved CLIP tower folder"),
])
def test_settings_errors_name_the_key(profile, overrides, message):
    with pytest.raises(PipelineError) as e:
        P.PwccaSettings.from_params(pwcca_params(profile, **overrides))
    assert message in str(e.value)


def test_a_family_named_like_a_pwcca_system_is_refused():
    p = values("embedded")
    p["families"]["clip"] = p["families"]["bert"]
    with pytest.raises(PipelineError, match=r"`families` has the name 'clip', which `pwcca.pairs` reads as one of its own"):
        P.PwccaSettings.from_params(p)
