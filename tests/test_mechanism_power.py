"""The smallest difference the mechanism study detects at 80% power (xdbert/analysis/power.py)."""
import numpy as np
import pytest

from xdbert.analysis import cloze
from xdbert.analysis import mechanism as M
from xdbert.analysis import mechanism_stats as S
from xdbert.analysis import power as W

GATES = dict(n_boot=400, level=0.95, exact_below=20)  # fewer replicates than the study's 2000: seconds, not minutes
FAST = dict(n_sim=150, steps=5)


def vis(rate, seed, n_objects=32, per_object=8, n_seeds=5):
    """(seeds, examples) right/wrong: `n_objects` F+ objects of `per_object` examples, then 8 F0 objects."""
    rng = np.random.default_rng(seed)
    objects = np.concatenate([np.repeat(np.arange(n_objects), per_object), np.repeat(np.arange(100, 108), 8)])
    kinds = np.array(["F+"] * (n_objects * per_object) + ["F0"] * 64)
    return rng.random((n_seeds, len(objects))) < rate, objects, kinds


def cloze_case(n_objects, seed):
    """A model answering 6 frames per object at random among 4 attributes; the twin's attribute is another."""
    rng = np.random.default_rng(seed)
    real = rng.integers(0, 4, n_objects)
    return rng.integers(0, 4, (n_objects, 6)), real, (real + 1 + rng.integers(0, 3, n_objects)) % 4


# ----------------------------------------------------------------------------------------------------
# The intervals are the study's
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_objects,kind", [(32, "F+"), (8, "F+"), (32, None)])  # bootstrap, exact, by example
def test_the_planted_interval_is_the_studys_to_the_bit(n_objects, kind):
    a, objects, kinds = vis(0.3, 0, n_objects=n_objects)
    b, _, _ = vis(0.3, 1, n_objects=n_objects)
    interval_of = W.difference_of(b, objects if kind else None, kinds if kind else None, kind, GATES, 7)
    rng = np.random.default_rng(2)
    for share in (0.0, 0.2, 0.6):
        planted = a | (rng.random(a.shape) < share)
        assert interval_of(planted) == M.difference(planted, b, objects if kind else None, kinds if kind else None,
                                                    kind, GATES, 7)


@pytest.mark.parametrize("n_objects", [72, 12])  # random flips, all flips enumerated
def test_the_planted_cloze_interval_is_rung_ms(n_objects):
    answers, real, twin = cloze_case(n_objects, 3)
    interval_of = W.memorized_of(answers, real, twin, 0.95, 2000, 5)
    rng = np.random.default_rng(4)
    for share in (0.0, 0.1, 0.4):
        right = (answers == real[:, None]) | (rng.random(answers.shape) < share)
        planted = np.where(right, real[:, None], answers)  # a planted answer is the real attribute
        assert interval_of(right) == cloze.memorized(planted, real, twin, 0.95, 2000, 5)["difference"]
    every = interval_of(np.ones_like(answers, dtype=bool))
    assert every.estimate == 1.0  # all real, none the twin's


# ----------------------------------------------------------------------------------------------------
# Power
# ----------------------------------------------------------------------------------------------------

def test_a_zero_share_passes_at_the_intervals_error_rate():
    """No shift planted, two models of one accuracy: the clause passes about as often as its interval's
    one-sided error (2.5% at 95%), far from the 80% a real shift needs."""
    passed = []
    for seed in range(40):
        a, objects, kinds = vis(0.3, 2 * seed)
        b, _, _ = vis(0.3, 2 * seed + 1)
        interval_of = W.difference_of(b, objects, kinds, "F+", GATES, seed)
        passed.append(W.power_at(a, np.broadcast_to(kinds == "F+", a.shape), interval_of, 0.0, 1, seed)[0])
    assert np.mean(passed) <= 0.1, passed


def test_power_and_the_planted_size_rise_with_the_share():
    a, objects, kinds = vis(0.3, 0)
    b, _, _ = vis(0.3, 1)
    interval_of = W.difference_of(b, objects, kinds, "F+", GATES, 0)
    eligible = np.broadcast_to(kinds == "F+", a.shape)
    curve = [W.power_at(a, eligible, interval_of, share, 100, 0) for share in (0.02, 0.1, 0.2, 0.4)]
    powers, sizes = zip(*curve)
    assert list(powers) == sorted(powers) and powers[0] < 0.5 < powers[-1] == 1.0, powers
    assert list(sizes) == sorted(sizes)
    # Y in accuracy on F+: turning a share of the ~70% wrong answers right adds about share x 0.7
    assert sizes[-1] == pytest.approx(0.4 * 0.7, abs=0.03)
    # the plants nest (one set of draws for every share): on a fine grid, with few simulations, the power
    # still never drops, as the bisection needs; fresh draws per share would make it wobble here
    fine = [W.power_at(a, eligible, interval_of, share, 20, 0)[0] for share in np.linspace(0.04, 0.16, 13)]
    assert fine == sorted(fine) and fine[0] < fine[-1], fine


def test_a_planted_shift_at_the_figure_passes_the_clause():
    a, objects, kinds = vis(0.3, 10)
    b, _, _ = vis(0.3, 11)
    p = W.difference_power(a, b, objects, kinds, "F+", GATES, 0, **FAST)
    assert p.reached and p.power >= 0.8 and 0 < p.share < 1 and p.detects > 0
    eligible = np.broadcast_to(kinds == "F+", a.shape)
    interval_of = W.difference_of(b, objects, kinds, "F+", GATES, 0)
    # measured again with plants the search never drew: the figure holds at its share, and above it
    assert W.power_at(a, eligible, interval_of, p.share, 300, 99)[0] >= 0.7
    assert W.power_at(a, eligible, interval_of, min(1.0, p.share + 0.1), 300, 99)[0] >= 0.9
    # one share step (1/32) below, the search's own draws fall short of 80%
    assert W.power_at(a, eligible, interval_of, p.share - 1 / 32, FAST["n_sim"], 0)[0] < 0.8


def test_rung_m_gets_its_figure_too():
    answers, real, twin = cloze_case(72, 6)
    p = W.memorized_power(answers, real, twin, 0.95, 2000, 0, **FAST)
    assert p.reached and p.power >= 0.8 and 0 < p.detects < 1


def test_a_clause_no_shift_can_pass_says_so():
    """b right on every F+ example: a can at most tie it, so even share 1 never passes."""
    a, objects, kinds = vis(0.3, 0)
    b = np.ones_like(a)
    p = W.difference_power(a, b, objects, kinds, "F+", GATES, 0, **FAST)
    assert (p.reached, p.share, p.power) == (False, 1.0, 0.0)
    # every wrong F+ answer turned right: Y is all a lacked, from its observed F+ cell to 1
    assert p.detects == pytest.approx(1 - M.difference(a, np.zeros_like(a), objects, kinds, "F+", GATES, 0).estimate)
    assert "no shift" in W.power_text(p) and "no shift" in W.null_reading(S.Interval(-0.7, -0.8, -0.6, ""), p)


def test_the_null_reading():
    p = W.Power(0.25, 0.117, 0.82, True, 500)
    d = S.Interval(0.01, -0.04, 0.063, S.BOOTSTRAP_OBJECTS)
    assert W.null_reading(d, p) == ("XDBERT moved less than +0.06 (the interval's upper end); "
                                    "the study detects +0.12 (80% power)")
    assert W.power_json(p) == {"share": 0.25, "detects": 0.117, "power": 0.82, "reached": True, "n_sim": 500,
                               "target": 0.8}


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------

def test_bad_input_is_named():
    a, objects, kinds = vis(0.3, 0)
    b, _, _ = vis(0.3, 1)
    interval_of = W.difference_of(b, objects, kinds, "F+", GATES, 0)
    eligible = np.broadcast_to(kinds == "F+", a.shape)
    for share in (-0.1, 1.5):
        with pytest.raises(ValueError, match="share"):
            W.power_at(a, eligible, interval_of, share, 10, 0)
    with pytest.raises(ValueError, match="same seeds and examples"):
        W.difference_power(a, b[:, :-1], objects, kinds, "F+", GATES, 0, **FAST)
    with pytest.raises(ValueError, match="`eligible` must have the shape"):
        W.power_at(a, eligible[:, :-1], interval_of, 0.5, 10, 0)
    with pytest.raises(ValueError, match="no wrong answer"):
        W.power_at(np.ones_like(a), eligible, interval_of, 0.5, 10, 0)
    with pytest.raises(ValueError, match="target"):
        W.smallest_shift(a, eligible, interval_of, 0, 10, target=1.0)
    with pytest.raises(ValueError, match="one real and one twin"):
        W.memorized_power(np.zeros((4, 6), int), np.zeros(3, int), np.zeros(4, int), 0.95, 100, 0)


def test_a_clause_with_every_answer_right_has_no_power_figure_and_says_so():
    right = np.ones((3, 40), bool)
    eligible = np.ones_like(right)

    def interval_of(planted):
        return S.Interval(0.1, 0.05, 0.15, "test")

    p = W.smallest_shift(right, eligible, interval_of, seed=0, n_sim=10)
    assert (p.share, p.detects, p.power, p.reached) == (0.0, 0.0, 1.0, False)
    assert W.power_text(p) == "power not read: every answer it could plant into is right already"


def test_a_clause_that_passes_as_it_stands_needs_no_shift():
    right = np.zeros((3, 40), bool)

    def interval_of(planted):
        return S.Interval(0.3, 0.1, 0.5, "test")  # above 0 whatever is planted

    p = W.smallest_shift(right, np.ones_like(right), interval_of, seed=0, n_sim=10)
    assert (p.share, p.detects, p.power, p.reached) == (0.0, 0.0, 1.0, True)
    assert W.power_text(p) == "passes as it stands: no shift to plant"
