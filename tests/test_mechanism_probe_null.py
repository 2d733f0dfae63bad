"""The representation probe's null of re-drawn fact tables (issue 68, rung R; xdbert/analysis/probe.py
`redrawn_classes`, xdbert/analysis/mechanism.py `probe_row`): the embedded world's 72 captioned objects of the
de-risk's facts seed, their real attributes as classes, and the tables `draw_facts` draws with the null's seeds."""
from collections import Counter

import numpy as np
import pytest

from xdbert.analysis import mechanism_stats as S
from xdbert.analysis import probe
from xdbert.analysis.mechanism import probe_row
from xdbert.data.mechanism import MechanismSettings
from xdbert.profiles import values

DRAWS = 300   # re-drawn tables (the study draws `gates.n_perm`, 1,000)
LAM = 10.0
GATES = {"alpha_r": 0.05}


@pytest.fixture(scope="module")
def world():
    params = values("embedded")
    params["mechanism"]["seed"] = 100   # the de-risk's seed: the tests stay put when the study's seed moves
    s = MechanismSettings.from_params(params)
    facts = s.facts()
    attributes = list(facts.attributes)
    objects = facts.captioned()
    words = [o.sing for o in objects]
    old = {o.sing for o in s.objects[:s.n_old]}
    return {
        "seed": s.seed, "attributes": attributes, "words": words,
        "classes": np.array([attributes.index(facts.real[w]) for w in words]),
        "twin": np.array([attributes.index(facts.twin[w]) for w in words]),
        "strata": [(o.sing in old, o.large, o.buildable) for o in objects],
        "null": probe.redrawn_classes(lambda k: s.facts(k).real, words, attributes, probe.null_seeds(DRAWS), s.seed),
    }


def encoding(classes: np.ndarray, seed: int, noise: float = 0.3) -> np.ndarray:
    """Features (objects, 64) of an encoder that holds `classes`: a direction per class, plus noise."""
    rng = np.random.default_rng(seed)
    return np.eye(4)[classes] @ rng.normal(size=(4, 64)) + noise * rng.normal(size=(len(classes), 64))


def strata_spread(classes: np.ndarray, strata: list) -> int:
    """Summed over the strata: the most common class's count minus the rarest's (0: every stratum even)."""
    total = 0
    for key in set(strata):
        counts = Counter(c for c, k in zip(classes.tolist(), strata) if k == key)
        total += max(counts[c] for c in range(4)) - min(counts[c] for c in range(4))
    return total


def test_the_null_is_tables_drawn_with_other_seeds(world):
    null = world["null"]
    assert null.shape == (DRAWS, len(world["words"])) and null.min() == 0 and null.max() == 3
    assert len({tuple(row) for row in null.tolist()}) == DRAWS  # every seed its own table
    assert not {0, 1, 100, world["seed"]} & set(probe.null_seeds(1000))  # no table a study or the de-risk reads
    assert not (null == world["classes"]).all(1).any()


def test_the_redrawn_tables_keep_the_class_counts_within_strata_a_shuffle_does_not(world):
    real, strata = world["classes"], world["strata"]
    rng = np.random.default_rng(0)
    redrawn = np.array([strata_spread(row, strata) for row in world["null"]])
    shuffled = np.mean([strata_spread(rng.permutation(real), strata) for _ in range(DRAWS)])
    # The real table is one draw of the same process: its spread lies among the re-drawn tables' spreads.
    assert np.percentile(redrawn, 1) <= strata_spread(real, strata) <= np.percentile(redrawn, 99)
    assert redrawn.mean() < shuffled / 2   # a free shuffle spreads the classes over the strata


def test_features_that_read_only_the_strata_sit_near_the_redrawn_null_not_the_shuffled_one(world):
    """The bias the re-draws keep: a readout of the strata predicts each object against its own class."""
    keys = sorted(set(world["strata"]))
    features = np.eye(len(keys))[[keys.index(k) for k in world["strata"]]]
    rng = np.random.default_rng(0)
    shuffled = np.stack([rng.permutation(world["classes"]) for _ in range(DRAWS)])
    row = probe_row([features], world["classes"], world["null"], 4, LAM)[0]
    free = probe_row([features], world["classes"], shuffled, 4, LAM)[0]
    assert row["accuracy"] < 0.05
    assert row["null_mean"] < 0.08 < 0.12 < free["null_mean"]
    assert abs(row["selectivity"]) < abs(free["selectivity"]) / 2


def test_features_that_encode_the_real_table_read_it_with_selectivity_one_minus_the_null_mean(world):
    row = probe_row([encoding(world["classes"], 1)], world["classes"], world["null"], 4, LAM)[0]
    assert set(row) == {"layer", "accuracy", "p", "null_mean", "null_q95", "selectivity", "correct"}
    assert row["accuracy"] == 1.0 and row["p"] == 1 / (DRAWS + 1)
    assert row["null_mean"] == pytest.approx(0.24, abs=0.03) and row["null_q95"] < 0.40
    assert row["selectivity"] == pytest.approx(1 - row["null_mean"]) and row["selectivity"] > 0.7


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_features_that_encode_nothing_have_no_selectivity(world, seed):
    features = np.random.default_rng(seed).normal(size=(len(world["words"]), 64))
    rows = probe_row([features, features[:, :8]], world["classes"], world["null"], 4, LAM)
    assert [r["layer"] for r in rows] == [0, 1]
    for row in rows:
        assert row["p"] > 0.05 and abs(row["selectivity"]) < 0.1
        assert row["null_mean"] == pytest.approx(0.24, abs=0.03)


def test_the_twins_encoder_fails_rung_r_and_the_real_one_passes(world):
    """R reads caption_mlm beside caption_mlm_nofacts, whose encoder holds the twin's table: the twin's
    encoder in caption_mlm's place gives R's paired test no pass (issue 68: "the probe on the twin's encoder:
    R FAILS"), with F+ itself above 0, so only the probe can fail it."""
    real, twin, null = world["classes"], world["twin"], world["null"]
    f_plus = S.Interval(0.3, 0.1, 0.5, "bootstrap")
    twins = [probe_row([encoding(twin, seed)], real, null, 4, LAM)[0] for seed in (5, 6)]
    facts = probe_row([encoding(real, 7)], real, null, 4, LAM)[0]
    for row in twins:  # the twin's table says nothing of the real one
        assert row["p"] > 0.05 and row["selectivity"] < 0.05

    def rung_r(a: dict, b: dict) -> S.Gate:
        p = probe.sign_flip_p(np.array(a["correct"]), np.array(b["correct"]), 10000, seed=0)
        return S.rung_r(f_plus, a["accuracy"] - b["accuracy"], p, GATES)

    assert rung_r(twins[0], twins[1]).state == S.FAIL
    assert rung_r(facts, twins[1]).state == S.PASS


def test_a_seed_list_with_the_studys_own_seed_is_refused(world):
    with pytest.raises(ValueError, match=r"other seeds than the study's own \(100\)"):
        probe.redrawn_classes(lambda k: {}, world["words"], world["attributes"], [10_000, 100], 100)
