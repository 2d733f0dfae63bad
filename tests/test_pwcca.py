"""PWCCA (paper Table 2): CCA against independent computations, invariances, and the word-set guards."""
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.stats

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
    r = P.pwcca(x, x, eps=0.0)
    assert r.value == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(r.rho, 1.0, atol=1e-9)
    assert r.weights.sum() == pytest.approx(1.0)


def test_invertible_linear_map_gives_one():
    x, _ = views(d1=10)
    a = np.random.default_rng(1).normal(size=(10, 10))
    assert abs(np.linalg.det(a)) > 1e-3
    assert P.pwcca(x, x @ a + 3.0, eps=0.0).value == pytest.approx(1.0, abs=1e-8)
    # the relative ridge keeps this true at the default eps up to its tiny bias
    assert P.pwcca(x, x @ a, eps=1e-8).value == pytest.approx(1.0, abs=1e-5)


def test_scale_of_the_data_does_not_matter():
    x, y = views()
    ref = P.pwcca(x, y, eps=1e-3).value
    assert P.pwcca(1e-3 * x, 1e4 * y, eps=1e-3).value == pytest.approx(ref, rel=1e-9)


def test_independent_noise_is_far_lower():
    x, y = views(n=2000, noise=0.3)
    noise = np.random.default_rng(7).uniform(-1, 1, size=x.shape)
    related, unrelated = P.pwcca(x, y).value, P.pwcca(x, noise).value
    assert related > 0.8
    assert unrelated < 0.15  # ~ sqrt(d / n) for independent views
    assert unrelated < related / 5


def test_one_dimensional_views_give_abs_pearson():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 1))
    y = -0.7 * x + rng.normal(size=(200, 1))
    r = abs(scipy.stats.pearsonr(x[:, 0], y[:, 0])[0])
    assert P.cca(x, y, eps=0.0).rho[0] == pytest.approx(r, abs=1e-12)
    assert P.pwcca(x, y, eps=0.0).value == pytest.approx(r, abs=1e-12)


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
    got = P.cca(x, y, eps=0.0)
    np.testing.assert_allclose(got.rho, rho, atol=1e-10)
    np.testing.assert_allclose(P.pwcca(x, y, eps=0.0, convention="svcca").rho, rho, atol=1e-10)
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
    res = P.pwcca(x, y, eps=0.0, convention="whitened")
    assert res.weighted_by == "y"
    np.testing.assert_allclose(res.weights, weights, atol=1e-8)
    assert res.value == pytest.approx(float(weights @ rho_y), abs=1e-10)
    assert P.pwcca(x, y, eps=0.0, weight_by="x").weighted_by == "x"


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
    got = P.pwcca(x, y, eps=case["epsilon"], min_ratio=1, convention="svcca")
    assert len(got.rho) == case["n_coefficients"]
    assert got.value == pytest.approx(case["pwcca"], abs=1e-8)
    assert float(np.mean(got.rho)) == pytest.approx(case["mean_cca"], abs=1e-8)
    # the whitened convention finds the same correlations but weighs them otherwise, by Table 2-sized gaps
    whitened = P.pwcca(x, y, eps=case["epsilon"], min_ratio=1, convention="whitened")
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
    got = P.pwcca(x, y, eps=0.0, convention="svcca")
    assert got.weighted_by == "y" and len(got.weights) == 6
    assert got.value == pytest.approx(svcca_second_view(x, y), abs=1e-10)


def test_unknown_convention_is_refused():
    x, y = views()
    with pytest.raises(ValueError, match="convention must be one of"):
        P.pwcca(x, y, convention="morcos")


def test_too_few_words_names_both_numbers():
    x, y = views(n=50, d1=12, d2=8)
    with pytest.raises(PipelineError, match=r"50 shared words.*widths 12 and 8.*60 words"):
        P.pwcca(x, y)
    assert P.pwcca(x, y, min_ratio=4).value > 0  # 50 >= 4 * 12


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
    out = P.pairwise({"encoder": x, "clip": y}, [("encoder", "clip")])
    assert 0 < out[("encoder", "clip")].value < 1
    with pytest.raises(PipelineError, match="unknown PWCCA system 'electra'"):
        P.pairwise({"encoder": x}, [("encoder", "electra")])


# ----------------------------------------------------------------------------------------------------
# The stage, end to end on local files (the paper profile's ELECTRA loader pointed at a local folder)
# ----------------------------------------------------------------------------------------------------

def load_stage(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "stages" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"stage_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stage_writes_table2_with_paper_values(tmp_path, monkeypatch):
    import json

    import yaml
    from transformers import BertTokenizer, ElectraConfig, ElectraModel

    from xdbert.clip import clip_tokenizer
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.encoders import build_masked_lm
    from xdbert.model.saving import save_clip_tower

    clip_words = sorted(P.clip_bpe_words(clip_tokenizer("xdbert-tiny").encoder).items(), key=lambda kv: kv[1])
    words = [w for w, _ in clip_words[:400]]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "##s", "."] + words)}
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(tmp_path / "models" / "tokenizer")
    electra_dir = tmp_path / "electra"
    ElectraModel(ElectraConfig(vocab_size=len(vocab), embedding_size=24, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained(electra_dir)
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(electra_dir)
    params = {
        "profile": "paper",
        "model": {"encoder": "random:bert", "encoder_config": {"hidden_size": 32, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "intermediate_size": 64}, "clip": "xdbert-tiny", "clip_pretrained": "", "seed": 0},
        "pwcca": {"electra": str(electra_dir), "clip_tower": "", "eps": 1e-6, "convention": "svcca",
                  "weight_by": "smaller", "min_words_ratio": 5, "seed": 0,
                  "pairs": [["encoder", "electra"], ["encoder", "clip"], ["electra", "clip"], ["encoder", "random"]]},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # what pretrain_encoder leaves for a random:bert encoder (untrained here: the test checks the table's machinery)
    build_masked_lm("random:bert", params["model"]["encoder_config"], len(vocab)).save_pretrained(
        tmp_path / PRETRAIN_ENCODER)
    # and what the `pretrain_clip` stage leaves: the CLIP tower adaptation starts from
    save_clip_tower(CLIPTextTower.build("xdbert-tiny"), tmp_path / PRETRAIN_CLIP, "xdbert-tiny")
    monkeypatch.chdir(tmp_path)
    load_stage("pwcca").main()

    out = json.loads((tmp_path / "results" / "pwcca.json").read_text())
    assert out["shared_words"] == 400
    pairs = {(r["a"], r["b"]): r for r in out["pairs"].values()}
    assert set(out["pairs"]) == {"encoder/electra", "encoder/clip", "electra/clip", "encoder/random"}
    assert pairs[("encoder", "clip")]["widths"] == [32, 64]
    assert pairs[("electra", "clip")]["widths"] == [24, 64]  # ELECTRA's embedding width, not its hidden size
    assert pairs[("encoder", "random")]["paper"] == 0.3569
    assert all(0 < r["pwcca"] < 1 for r in pairs.values())
    md = (tmp_path / "reports" / "table2.md").read_text()
    assert "| L/CLIP |" in md and "| 0.498 |" in md and "| ELECTRA/CLIP |" in md and "400 shared words" in md
    assert out["convention"] == "svcca" and "**svcca** convention: google/svcca's `compute_pwcca`" in md

    params["pwcca"]["min_words_ratio"] = 20  # 400 words < 20 x 64
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="400 shared words.*widths"):
        load_stage("pwcca").main()
    params["pwcca"]["electra"] = ""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="`pwcca.electra` is empty"):
        load_stage("pwcca").main()


# ----------------------------------------------------------------------------------------------------
# The `pwcca` params
# ----------------------------------------------------------------------------------------------------

def pwcca_params(**overrides) -> dict:
    params = values("embedded")
    params["pwcca"].update(overrides)
    return params


def test_settings_from_the_embedded_profile():
    s = P.PwccaSettings.from_params(values("embedded"))
    assert s.pairs == (("encoder", "clip"), ("encoder", "random"), ("clip", "random"))
    assert s.systems == {"encoder", "clip", "random"} and s.electra is None  # read only when a pair uses it
    assert (s.eps, s.weight_by, s.min_words_ratio, s.seed, s.clip_tower) == (1e-6, "smaller", 5.0, 0, "")
    paper = P.PwccaSettings.from_params(values("paper"))
    assert paper.electra == "google/electra-base-discriminator" and ("encoder", "electra") in paper.pairs
    assert paper.convention == "svcca"  # the reference's, as the paper most likely computed Table 2


@pytest.mark.parametrize("overrides, message", [
    ({"pairs": []}, "`pwcca.pairs` must be a non-empty list of [a, b] pairs of encoder, electra, clip, random"),
    ({"pairs": [["encoder", "encoder"]]}, "entry ['encoder', 'encoder'] of `pwcca.pairs` must be two different systems"),
    ({"pairs": [["encoder", "bert"]]}, "unknown entry of `pwcca.pairs entry` 'bert'"),
    ({"pairs": [["encoder", "electra"]]}, "`pwcca.pairs` uses `electra` but `pwcca.electra` is empty"),
    ({"eps": -1}, "`pwcca.eps` must be a number >= 0; got -1"),
    ({"eps": "small"}, "`pwcca.eps` must be a number >= 0; got 'small'"),
    ({"eps": float("nan")}, "`pwcca.eps` must be a number >= 0; got nan"),
    ({"electra": 5}, "`pwcca.electra` must be an ELECTRA hub id or folder, or \"\" for none; got 5"),
    ({"clip_tower": ["models"]}, "`pwcca.clip_tower` must be a saved CLIP tower folder"),
    ({"weight_by": "z"}, "unknown pwcca.weight_by 'z'; allowed: x, y, smaller"),
    ({"convention": "morcos"}, "unknown pwcca.convention 'morcos'; allowed: svcca, whitened"),
    ({"min_words_ratio": 0}, "`pwcca.min_words_ratio` must be a positive number"),
    ({"seed": -2}, "`pwcca.seed` must be a non-negative integer"),
    ({"clip_tower": "models/nothing"}, "`pwcca.clip_tower: models/nothing` is not a saved CLIP tower folder"),
])
def test_settings_errors_name_the_key(overrides, message):
    with pytest.raises(PipelineError) as e:
        P.PwccaSettings.from_params(pwcca_params(**overrides))
    assert message in str(e.value)

