"""The mechanism study's cells, intervals and gates (xdbert/analysis/mechanism_stats.py)."""
import itertools

import numpy as np
import pytest
import scipy.stats

from xdbert.analysis import mechanism_stats as M
from xdbert.profiles import values

GATES = values("embedded")["mechanism"]["gates"]  # the pre-registered thresholds

DRAWS = dict(n_boot=2000, level=0.95, exact_below=20, seed=0)


def vis(n_objects=32, per_object=8, n_seeds=5, rate=0.6, seed=0, kind="F+"):
    """Random right/wrong (seeds, examples) on `n_objects` objects of one kind, `per_object` examples each."""
    rng = np.random.default_rng(seed)
    objects = np.repeat(np.arange(n_objects), per_object)
    kinds = np.full(len(objects), kind)
    return rng.random((n_seeds, len(objects))) < rate, objects, kinds


# ----------------------------------------------------------------------------------------------------
# cells and intervals
# ----------------------------------------------------------------------------------------------------

def test_unit_counts_group_a_kinds_examples_by_object():
    correct = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=bool)
    objects = np.array(["kite", "kite", "boat", "kite", "boat"])
    kinds = np.array(["F+", "F+", "F+", "T=", "F+"])
    right, size = M.unit_counts(correct, objects, kinds, "F+")
    np.testing.assert_array_equal(right, [[1, 1], [2, 0]])  # units sorted: boat, kite
    np.testing.assert_array_equal(size, [2, 2])
    with pytest.raises(ValueError, match="no example of kind"):
        M.unit_counts(correct, objects, kinds, "F0")


def test_the_bootstrap_resamples_whole_objects():
    """Each object's examples all right or all wrong (per seed), 8 examples each: a replicate's accuracy counts
    whole objects, a multiple of 1/25; resampling examples would give multiples of 1/200."""
    rng = np.random.default_rng(0)
    objects = np.repeat(np.arange(25), 8)
    correct = (rng.random((5, 25)) < 0.5)[:, objects]
    right, size = M.unit_counts(correct, objects, None, None)
    replicates = M.bootstrap_replicates(right, size, 2000, seed=0)
    scaled = replicates * 25
    np.testing.assert_allclose(scaled, np.round(scaled), atol=1e-9)
    assert len(np.unique(replicates)) > 5  # they do vary


def test_the_seeds_are_resampled_too():
    """Every object right on seed 0, wrong on the others: the seed draw alone makes replicates differ."""
    objects = np.repeat(np.arange(25), 4)
    correct = np.zeros((3, 100), dtype=bool)
    correct[0] = True
    right, size = M.unit_counts(correct, objects, None, None)
    assert set(np.unique(M.bootstrap_replicates(right, size, 500, seed=0))) == {0.0, 1.0}  # median of 3 drawn seeds


def test_a_cell_is_the_median_over_seeds():
    correct, objects, kinds = vis(n_seeds=3)
    per_seed = correct.mean(1)
    c = M.cell(correct, objects, kinds, "F+", **DRAWS)
    assert c.estimate == np.median(per_seed)
    assert c.low < c.estimate < c.high and c.method == M.BOOTSTRAP_OBJECTS


@pytest.mark.parametrize("n_objects", [32, 8])  # bootstrap, and the exact interval
def test_a_model_against_itself_differs_by_exactly_zero(n_objects):
    correct, objects, kinds = vis(n_objects=n_objects)
    d = M.paired_difference(correct, correct, objects, kinds, "F+", **DRAWS)
    assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)
    assert d.method == (M.EXACT if n_objects < 20 else M.BOOTSTRAP_OBJECTS)


def test_a_clear_gain_lies_above_zero():
    a, objects, kinds = vis(rate=0.8, seed=1)
    b, _, _ = vis(rate=0.5, seed=2)
    d = M.paired_difference(a, b, objects, kinds, "F+", **DRAWS)
    assert d.low > 0 and d.estimate == pytest.approx(0.3, abs=0.06)
    assert M.paired_difference(b, a, objects, kinds, "F+", **DRAWS).high < 0


def test_noise_covers_zero_in_most_seeds():
    covers = []
    for seed in range(10):
        a, objects, kinds = vis(seed=2 * seed)
        b, _, _ = vis(seed=2 * seed + 1)
        d = M.paired_difference(a, b, objects, kinds, "F+", **DRAWS)
        covers.append(d.low <= 0 <= d.high)
    assert sum(covers) >= 8, covers


def test_the_difference_is_paired():
    """b is a with a tenth of its answers flipped: paired, the interval is far narrower than from the two
    cells' own widths, which unpaired draws would add up."""
    a, objects, kinds = vis(seed=3)
    b = a ^ (np.random.default_rng(4).random(a.shape) < 0.1)
    d = M.paired_difference(a, b, objects, kinds, "F+", **DRAWS)
    ca, cb = (M.cell(x, objects, kinds, "F+", **DRAWS) for x in (a, b))
    assert d.high - d.low < 0.5 * ((ca.high - ca.low) + (cb.high - cb.low))


def test_a_task_without_objects_resamples_examples():
    rng = np.random.default_rng(5)
    correct = rng.random((5, 400)) < 0.8
    c = M.cell(correct, None, None, None, **DRAWS)
    assert c.method == M.BOOTSTRAP_EXAMPLES and c.low < c.estimate < c.high
    assert c.high - c.low == pytest.approx(2 * 1.96 * np.sqrt(0.8 * 0.2 / 400), rel=0.3)


def hand_case(level):
    """4 objects of 10 examples, the same on 3 seeds: a gets 1, 2, 3 and 6 of them right, b none."""
    objects = np.repeat(np.arange(4), 10)
    a = np.zeros((3, 40), dtype=bool)
    for obj, n_right in enumerate([1, 2, 3, 6]):
        a[:, obj * 10:obj * 10 + n_right] = True
    return M.paired_difference(a, np.zeros_like(a), objects, None, None, n_boot=2000, level=level,
                               exact_below=20, seed=0)


def test_the_exact_interval_on_a_hand_computed_case():
    """Differences 0.1, 0.2, 0.3, 0.6. The 15 subset means, sorted: 0.1, 0.15, 0.2, 0.2, 0.2, 0.25, 0.3, 0.3,
    0.3, 0.333, 0.35, 0.367, 0.4, 0.45, 0.6. At level 0.75, k = floor(0.125 * 16) = 2: [0.15, 0.45]. At 0.95,
    k = floor(0.025 * 16) = 0: 4 objects can reject no difference, so the interval is all of [-1, 1]."""
    d = hand_case(0.75)
    assert d.method == M.EXACT and d.estimate == pytest.approx(0.3)
    assert (d.low, d.high) == (pytest.approx(0.15), pytest.approx(0.45))
    assert hand_case(0.95)[1:3] == (-1.0, 1.0)


def sign_flip_tails(values, mu):
    """Both one-sided p-values of the centre mu, by enumerating all 2^n sign assignments of values - mu."""
    d = np.asarray(values) - mu
    flipped = np.array([np.dot(s, d) for s in itertools.product([-1, 1], repeat=len(d))])
    return np.mean(flipped >= d.sum() - 1e-12), np.mean(flipped <= d.sum() + 1e-12)


def test_the_exact_interval_inverts_the_sign_flip_test():
    """8 objects at 95% (the F0 case): at each end of the interval the test does not reject, just beyond it does."""
    values = np.random.default_rng(6).random(8)
    low, high = M.exact_interval(values, 0.95, (0.0, 1.0))
    assert min(sign_flip_tails(values, low)) > 0.025 and min(sign_flip_tails(values, high)) > 0.025
    assert sign_flip_tails(values, low - 1e-6)[0] <= 0.025
    assert sign_flip_tails(values, high + 1e-6)[1] <= 0.025


def test_the_sign_flip_interval_enumerates_small_samples_and_samples_flips_for_large_ones():
    """Up to 16 objects it is `exact_interval`; at 18 (still enumerable here, 2^18 flips) the random flips'
    interval lands within a few hundredths of the exact one, and over 72 objects it holds the mean."""
    rng = np.random.default_rng(3)
    small = rng.random(12) - 0.3
    assert M.sign_flip_interval(small, 0.95, (-1.0, 1.0), 2000, 0) == M.exact_interval(small, 0.95, (-1.0, 1.0))
    values = rng.random(18) - 0.3
    exact = M.exact_interval(values, 0.95, (-1.0, 1.0))
    sampled = M.sign_flip_interval(values, 0.95, (-1.0, 1.0), 10000, 0)
    assert M.method_of(18) == M.MONTE_CARLO and np.allclose(sampled, exact, atol=0.03)
    big = rng.normal(0.1, 0.5, 72)
    low, high = M.sign_flip_interval(big, 0.95, (-1.0, 1.0), 10000, 0)
    assert low < big.mean() < high and high - low < 0.4
    assert M.sign_flip_interval(big, 0.95, (-1.0, 1.0), 10000, 0) == (low, high)  # seeded


def test_an_f0_cell_gets_an_exact_interval():
    correct, objects, kinds = vis(n_objects=8, kind="F0")
    c = M.cell(correct, objects, kinds, "F0", **DRAWS)
    assert c.method == M.EXACT and 0 <= c.low < c.estimate < c.high <= 1


def test_an_exact_cell_estimates_the_centre_its_interval_is_for():
    """Seeds that disagree: each of 3 seeds gets a different two of 8 objects right. The pooled accuracy is 0.25
    on every seed, but each object's median over seeds is 0, so the interval for that centre is [0, 0]: the
    estimate must be the centre (0), not the pooled 0.25, which would lie outside its own interval."""
    objects = np.repeat(np.arange(8), 4)
    correct = np.zeros((3, 32), dtype=bool)
    for seed in range(3):
        correct[seed, seed * 8:seed * 8 + 8] = True  # objects 2s and 2s + 1
    assert M.point(*M.unit_counts(correct, objects, None, None)) == 0.25
    c = M.cell(correct, objects, None, None, **DRAWS)
    assert c.method == M.EXACT and (c.estimate, c.low, c.high) == (0.0, 0.0, 0.0)
    d = M.paired_difference(correct, np.zeros_like(correct), objects, None, None, **DRAWS)
    assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------------------------------
# gates
# ----------------------------------------------------------------------------------------------------

def iv(estimate, low, high):
    return M.Interval(estimate, low, high, M.BOOTSTRAP_OBJECTS)


GAIN, NULL = iv(0.10, 0.04, 0.16), iv(0.01, -0.03, 0.04)


def test_gate_a():
    a = M.gate_a(iv(0.41, 0.30, 0.52), 1.0, 0.001, GATES)
    assert a.passed
    assert a.text == "PASS: CLIP-T(facts) - CLIP-T(twin) on F+ = +0.41 [0.30, 0.52]; tower probe 1.00, p 0.001"
    assert not M.gate_a(NULL, 1.0, 0.001, GATES).passed
    assert not M.gate_a(GAIN, 0.40, 0.02, GATES).passed  # the probe above chance, not below alpha 0.01


def test_gate_b():
    assert M.gate_b(GAIN).passed
    b = M.gate_b(iv(0.0, 0.0, 0.05))  # an interval that touches 0 is not above it
    assert b.state == "FAIL" and b.text.startswith("FAIL: full XDBERT - full nofacts on F+ = +0.00")


def test_gate_c():
    inside = {"corpus": (0.27, 0.31), "baseline": (0.25, 0.45), "pretrain_encoder": (0.23, 0.53)}
    assert M.gate_c(inside, GATES).passed
    leak = M.gate_c({**inside, "bag-of-words": (0.60, 0.001)}, GATES)
    assert not leak.passed and "bag-of-words 0.60, p 0.001" in leak.text
    with pytest.raises(ValueError):
        M.gate_c({}, GATES)


def test_gate_d_passes_fails_and_is_not_replicated():
    holds = M.Claim(GAIN, NULL, NULL, 0.01)
    assert M.gate_d(holds, holds, GATES).state == "PASS"
    assert M.gate_d(holds, None, GATES).state == "not replicated"
    assert M.gate_d(holds, M.Claim(GAIN, NULL, NULL, 0.3), GATES).state == "not replicated"
    for broken in (M.Claim(NULL, NULL, NULL, 0.01),   # no gain on F+
                   M.Claim(GAIN, GAIN, NULL, 0.01),   # a gain on T= too
                   M.Claim(GAIN, NULL, GAIN, 0.01),   # a gain on SST-2 too
                   M.Claim(GAIN, NULL, NULL, 0.2)):   # the probe does not see it
        d = M.gate_d(broken, holds, GATES)
        assert d.state == "FAIL" and not d.passed


def test_fisher_matches_scipy():
    for table in [(30, 5, 12, 10), (3, 4, 5, 1), (0, 0, 4, 4), (10, 0, 0, 10)]:
        expected = scipy.stats.fisher_exact([table[:2], table[2:]], alternative="greater").pvalue
        assert M.fisher_greater(*table) == pytest.approx(expected, rel=1e-12)


def test_gate_e():
    e = M.gate_e(45, 5, 12, 8, GATES)
    assert e.passed and e.text.startswith("PASS: F+ among improved 45/50, among worsened 12/20")
    assert not M.gate_e(40, 10, 16, 4, GATES).passed  # the same share as among the worsened
    assert not M.gate_e(0, 0, 10, 3, GATES).passed    # nothing improved


# ----------------------------------------------------------------------------------------------------
# the report's table
# ----------------------------------------------------------------------------------------------------

def records(a=True, b=True, c=True, d="FAIL"):
    gates = [M.gate_a(GAIN if a else NULL, 1.0, 0.001, GATES), M.gate_b(GAIN if b else NULL),
             M.gate_c({"corpus": (0.25, 0.4 if c else 0.001)}, GATES)]
    f_plus = iv(0.02, -0.03, 0.07)
    claim = {"FAIL": M.Claim(f_plus, NULL, NULL, 0.5), "PASS": M.Claim(GAIN, NULL, NULL, 0.01)}
    gates.append(M.gate_d(claim["FAIL" if d == "FAIL" else "PASS"], claim["PASS"] if d == "PASS" else None, GATES))
    return gates + [M.gate_e(30, 10, 20, 10, GATES)]


def test_the_gates_table_and_its_summary():
    text = M.gates_markdown(records())
    lines = text.splitlines()
    assert lines[0] == "| gate | tests | result | numbers |"
    assert lines[2].startswith("| A | the facts are in CLIP | PASS | CLIP-T(facts) - CLIP-T(twin) on F+ = +0.10")
    assert [line.split(" | ")[2] for line in lines[2:7]] == ["PASS", "PASS", "PASS", "FAIL", "FAIL"]
    assert lines[-1] == ("A-C pass, D null: the recipe did not move the facts into the encoder; the interval's "
                         "upper end is +0.07.")


def test_a_null_d_says_whether_the_upper_reference_shows_the_facts():
    """The caption control reads the facts directly: if even it does not beat the baseline, the null is not the recipe's."""
    gates = records()
    null = M.summary(gates)
    assert M.summary(gates, None) == null
    blind = M.summary(gates, iv(0.02, -0.08, 0.12))
    assert blind.startswith(null) and "does not beat the baseline on F+ either (+0.02 [-0.08, +0.12])" in blind
    assert "so the null says little about the recipe." in blind
    seen = M.summary(gates, iv(0.30, 0.10, 0.45))
    assert "beats the baseline on F+ by +0.30 [+0.10, +0.45]" in seen and seen.endswith("so the null is the recipe's.")
    assert M.summary(records(d="PASS"), iv(0.02, -0.08, 0.12)).startswith("A-D pass")  # only a null D is qualified
    assert M.gates_markdown(gates, iv(0.02, -0.08, 0.12)).splitlines()[-1] == blind


@pytest.mark.parametrize("kw, start", [
    (dict(a=False), "A fails"), (dict(b=False), "A passes, B fails"), (dict(c=False), "C fails"),
    (dict(d="not replicated"), "A-C pass, D not replicated"), (dict(d="PASS"), "A-D pass")])
def test_the_summary_names_what_failed(kw, start):
    assert M.summary(records(**kw)).startswith(start)


# ----------------------------------------------------------------------------------------------------
# the calibration ladder (issue 68)
# ----------------------------------------------------------------------------------------------------

def planted_answers(real, twin, share_known, seed=0):
    """(objects, 6 frames) answers: the real attribute on `share_known` of the objects, else a random one."""
    rng = np.random.default_rng(seed)
    answers = rng.integers(0, 4, (len(real), 6))
    known = rng.random(len(real)) < share_known
    answers[known] = np.asarray(real)[known, None]
    return answers


def test_rung_m_passes_a_reference_that_knows_its_facts_and_fails_one_that_does_not():
    from xdbert.analysis.cloze import memorized

    rng = np.random.default_rng(1)
    real, twin = rng.integers(0, 4, 72), rng.integers(0, 4, 72)
    thresholds = {**GATES, "m_accuracy": 0.5}
    knows = memorized(planted_answers(real, twin, 0.9), real, twin, 0.95, 10000, 0)
    blind = memorized(planted_answers(real, twin, 0.0, seed=2), real, twin, 0.95, 10000, 0)
    assert knows["real_accuracy"] > 0.85 and knows["difference"].low > 0
    assert blind["difference"].low <= 0 <= blind["difference"].high
    assert M.rung_m(knows, blind, thresholds).state == M.PASS
    assert M.rung_m(blind, blind, thresholds).state == M.FAIL          # the reference never learned: M fails
    assert M.rung_m(knows, knows, thresholds).state == M.FAIL          # a baseline outside its null: something leaks
    weak = memorized(planted_answers(real, twin, 0.3), real, twin, 0.95, 10000, 0)
    assert weak["difference"].low > 0 and weak["real_accuracy"] < 0.5
    assert M.rung_m(weak, blind, thresholds).state == M.FAIL           # above the twin, but under the threshold


def test_d_is_uninformative_never_fail_where_a_rung_below_failed():
    null = M.Interval(0.0, -0.1, 0.1, M.BOOTSTRAP_OBJECTS)
    claim = M.Claim(null, null, null, 0.5)
    rungs = [M.Gate("M", M.FAIL, "x"), M.Gate("R", M.PASS, "y")]
    assert M.failed_rung(rungs) == "M" and M.failed_rung([M.Gate("M", M.PASS, "x"), M.Gate("R", M.FAIL, "y")]) == "R"
    assert M.failed_rung([M.Gate("M", M.PASS, "x"), M.Gate("R", M.PASS, "y"), M.Gate("T", M.FAIL, "z")]) is None
    d = M.gate_d(claim, None, GATES, M.failed_rung(rungs))
    assert d.state == M.UNINFORMATIVE and d.numbers.startswith("rung M failed, so D is not read")
    assert M.gate_d(claim, None, GATES).state == M.FAIL
    gates = [M.Gate("A", M.PASS, ""), M.Gate("B", M.PASS, ""), M.Gate("C", M.PASS, ""), d]
    assert M.summary(gates).startswith("A-C pass, D uninformative: rung M failed")


def test_rung_r_reads_the_reference_beside_its_twin():
    above, null = M.Interval(0.2, 0.1, 0.3, M.BOOTSTRAP_OBJECTS), M.Interval(0.0, -0.1, 0.1, M.BOOTSTRAP_OBJECTS)
    assert M.rung_r(above, 0.3, 0.001, GATES | {"alpha_r": 0.05}).state == M.PASS
    assert M.rung_r(null, 0.3, 0.001, GATES | {"alpha_r": 0.05}).state == M.FAIL
    assert M.rung_r(above, 0.0, 0.5, GATES | {"alpha_r": 0.05}).state == M.FAIL


def test_rung_t_reads_the_stronger_control_and_fails_on_a_null_one():
    above, null = M.Interval(0.3, 0.1, 0.5, "m"), M.Interval(0.0, -0.2, 0.2, "m")
    g = GATES | {"alpha_t": 0.05}
    passing = M.rung_t({"distill_kl": (null, 0.0, 0.6), "distill_cos": (above, 0.4, 0.001)}, g)
    assert passing.state == M.PASS and passing.interval == above and passing.numbers.startswith("distill_cos - ")
    assert passing.numbers.endswith("read: distill_cos") and "distill_kl - distill_kl_nofacts on F+" in passing.numbers
    # the stronger by the probe is read even where the other form's F+ interval is above 0: no second chance
    assert M.rung_t({"distill_kl": (above, 0.1, 0.2), "distill_cos": (null, 0.3, 0.001)}, g).state == M.FAIL
    assert M.rung_t({"distill_kl": (null, 0.0, 0.6)}, g).state == M.FAIL
    with pytest.raises(ValueError, match="at least one control"):
        M.rung_t({}, g)
