"""The smallest difference the mechanism study detects with 80% power (issue 68, ../shared/MECHANISM.md
"Calibration": D is printed "with the smallest difference the study can detect at 80% power beside it").

A clause passes where a difference's interval lies above 0 (mechanism_stats.above_zero): D's F+ clause
(XDBERT minus `nofacts`), rung R's `vis` clause (`caption_mlm` minus its twin), rung M's cloze clause
(`caption_mlm`'s real-table accuracy minus the twin table's, per object). Its power is found by planting
a shift in the study's own data, at its objects and seeds: each wrong answer of the model is turned right
with probability `share`, the same interval is made again, and the share of `n_sim` simulations whose
interval's lower end is above 0 is the power. The planted size Y is the mean over the simulations of the
planted estimate minus the observed one, in the interval's units. A null reads "moved less than X (the
interval's upper end); the study detects Y".

All shares of one search plant with the same uniform draws (common random numbers): an entry planted at
one share is planted at every larger one. Every interval here only rises when wrong answers turn right
(a bootstrap replicate, a median of accuracies, rises; so do the sign-flip subset means), so each
simulation's pass is monotone in the share, the power curve is too, and a bisection finds its smallest
share reaching the target.

Cost: `n_sim` intervals per share, about 8 shares a search. The bootstrap's draws and the sign flips depend
only on the shapes and the seed (mechanism_stats.bootstrap_draws, random_flips), so they are drawn once per
clause here, and the fixed model's replicates once;
tests/test_mechanism_power.py checks that each interval equals the one the study computes, to the bit.

Pure numpy; the stage passes every value. Bad input raises ValueError.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import numpy as np

from xdbert.analysis import mechanism as M
from xdbert.analysis import mechanism_stats as S

TARGET = 0.8   # the power the study quotes its detectable difference at
N_SIM = 500    # simulations per share
STEPS = 7      # bisection steps over the share: a resolution of 1/128
PLANT_STREAM = 68  # the plants' own stream beside the study seed, independent of the bootstrap drawn from it

IntervalOf = Callable[[np.ndarray], S.Interval]


class Power(NamedTuple):
    """The smallest planted shift reaching `target` power: the share of wrong answers turned right, the
    planted size Y it adds to the difference (mean over the simulations), the power it reached, and whether
    it reached the target at all (if not, share 1: every wrong answer turned right)."""

    share: float
    detects: float
    power: float
    reached: bool
    n_sim: int
    target: float = TARGET


# ----------------------------------------------------------------------------------------------------
# The core: plant into the wrong entries of a 0/1 array, make the interval again
# ----------------------------------------------------------------------------------------------------

def power_at(right: np.ndarray, eligible: np.ndarray, interval_of: IntervalOf, share: float, n_sim: int,
             seed: int) -> tuple[float, float]:
    """(power, Y) at one `share`: in each of `n_sim` simulations every wrong entry of `right` where
    `eligible` turns right with probability `share`; the power is the share of simulations where
    `interval_of(planted)` lies above 0, Y the mean of its estimate minus that of `right` unplanted.

    Share 0 plants nothing: the power is then whether the study's own interval passes, the clause's
    false-positive rate where `right` holds no difference."""
    right, eligible = np.asarray(right, dtype=bool), np.asarray(eligible, dtype=bool)
    if right.shape != eligible.shape:
        raise ValueError(f"`eligible` must have the shape of `right` {right.shape}; got {eligible.shape}")
    if not 0 <= share <= 1:
        raise ValueError(f"the share of wrong answers turned right must lie in [0, 1]; got {share}")
    if n_sim < 1:
        raise ValueError(f"n_sim must be at least 1; got {n_sim}")
    if not (eligible & ~right).any():
        raise ValueError("no wrong answer to plant into: every eligible entry is already right")
    observed = interval_of(right).estimate
    rng = np.random.default_rng([PLANT_STREAM, seed])  # the same draws at every share: plants nest
    passes, added = 0, 0.0
    for _ in range(n_sim):
        planted = interval_of(right | (eligible & (rng.random(right.shape) < share)))
        passes += S.above_zero(planted)
        added += planted.estimate - observed
    return passes / n_sim, added / n_sim


def smallest_shift(right: np.ndarray, eligible: np.ndarray, interval_of: IntervalOf, seed: int, n_sim: int = N_SIM,
                   target: float = TARGET, steps: int = STEPS) -> Power:
    """The smallest share in (0, 1], to 2^-steps, whose planted shift passes with at least `target` power
    (`power_at`), by bisection (the power is monotone in the share, see the module's docstring); where
    even share 1 falls short, share 1 with `reached` False. Where every eligible answer is right already there
    is nothing to plant: share 0, `reached` False, the power whether the clause passes as it is. A clause that
    passes as it is needs no shift: share 0, `reached` True."""
    if not 0 < target < 1:
        raise ValueError(f"the target power must lie in (0, 1); got {target}")
    if np.shape(right) == np.shape(eligible) and not (np.asarray(eligible, bool) & ~np.asarray(right, bool)).any():
        return Power(0.0, 0.0, float(S.above_zero(interval_of(np.asarray(right, bool)))), False, n_sim, target)
    if S.above_zero(interval_of(np.asarray(right, bool))):
        return Power(0.0, 0.0, 1.0, True, n_sim, target)
    power, detects = power_at(right, eligible, interval_of, 1.0, n_sim, seed)
    if power < target:
        return Power(1.0, detects, power, False, n_sim, target)
    low, high, best = 0.0, 1.0, (power, detects)
    for _ in range(steps):
        share = (low + high) / 2
        reached = power_at(right, eligible, interval_of, share, n_sim, seed)
        if reached[0] >= target:
            high, best = share, reached
        else:
            low = share
    return Power(high, best[1], best[0], True, n_sim, target)


# ----------------------------------------------------------------------------------------------------
# The study's clauses as intervals of the planted model's 0/1 array
# ----------------------------------------------------------------------------------------------------

def difference_of(b: np.ndarray, objects: np.ndarray | None, kinds: np.ndarray | None, kind: str | None,
                  gates: Mapping, seed: int) -> IntervalOf:
    """a -> mechanism.difference(a, b, objects, kinds, kind, gates, seed), the same interval, with the draws
    and b's replicates made once. A cell of fewer than `exact_below` objects keeps the study's exact
    interval itself (no draws to share; 2^objects subsets per call)."""
    right_b, size = S.unit_counts(b, objects, kinds, kind)
    if len(size) < gates["exact_below"]:
        return lambda a: M.difference(a, b, objects, kinds, kind, gates, seed)
    draws = S.bootstrap_draws(*right_b.shape, gates["n_boot"], seed)
    replicates_b, point_b = S.resampled(draws, right_b, size), S.point(right_b, size)
    method = S.BOOTSTRAP_EXAMPLES if objects is None else S.BOOTSTRAP_OBJECTS

    def interval_of(a: np.ndarray) -> S.Interval:
        right_a, _ = S.unit_counts(a, objects, kinds, kind)
        spread = S.resampled(draws, right_a, size) - replicates_b
        return S.Interval(S.point(right_a, size) - point_b, *S.percentile_interval(spread, gates["level"]), method)

    return interval_of


def memorized_of(answers: np.ndarray, real: np.ndarray, twin: np.ndarray, level: float, n_flip: int,
                 seed: int) -> IntervalOf:
    """right -> cloze.memorized(planted answers, real, twin, level, n_flip, seed)["difference"], where
    `right` (objects, frames) marks the answers that are the real attribute: each planted one answers the
    real attribute (and so no longer the twin's). The random flips are drawn once (mechanism_stats.random_flips);
    up to ENUMERATED_UP_TO objects the exact interval."""
    answers, real, twin = np.asarray(answers), np.asarray(real), np.asarray(twin)
    n = len(answers)
    flips = None if n <= S.ENUMERATED_UP_TO else S.random_flips(n, n_flip, seed).astype(np.float64)
    method = S.method_of(n)

    def interval_of(right: np.ndarray) -> S.Interval:
        planted = np.where(right, real[:, None], answers)
        values = (planted == real[:, None]).mean(1) - (planted == twin[:, None]).mean(1)
        if flips is None:
            low, high = S.exact_interval(values, level, (-1.0, 1.0))
        else:
            low, high = S.flip_interval(values, flips, level, (-1.0, 1.0))
        return S.Interval(float(values.mean()), low, high, method)

    return interval_of


def difference_power(a: np.ndarray, b: np.ndarray, objects: np.ndarray | None, kinds: np.ndarray | None,
                     kind: str | None, gates: Mapping, seed: int, n_sim: int = N_SIM, steps: int = STEPS) -> Power:
    """D's F+ clause or R's `vis` clause: a's wrong answers on `kind` (every example where None) turned
    right until a minus b (mechanism.difference) passes with 80% power."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"a paired difference needs the same seeds and examples; got shapes {a.shape} and {b.shape}")
    if kind is not None and (kinds is None or len(kinds) != a.shape[1]):
        raise ValueError(f"kind {kind!r} needs `kinds`, one per example ({a.shape[1]})")
    on_kind = np.ones(a.shape[1], dtype=bool) if kind is None else np.asarray(kinds) == kind
    eligible = np.broadcast_to(on_kind, a.shape)
    return smallest_shift(a, eligible, difference_of(b, objects, kinds, kind, gates, seed), seed, n_sim,
                          steps=steps)


def memorized_power(answers: np.ndarray, real: np.ndarray, twin: np.ndarray, level: float, n_flip: int,
                    seed: int, n_sim: int = N_SIM, steps: int = STEPS) -> Power:
    """Rung M's cloze clause: the model's wrong cloze answers (objects, frames) turned to the real attribute
    until real minus twin (cloze.memorized) passes with 80% power."""
    answers, real = np.asarray(answers), np.asarray(real)
    if answers.ndim != 2 or len(real) != len(answers) or len(twin) != len(answers):
        raise ValueError(f"`answers` must be (objects, frames) with one real and one twin attribute per object; "
                         f"got shapes {answers.shape}, {np.shape(real)} and {np.shape(twin)}")
    right = answers == real[:, None]
    return smallest_shift(right, np.ones_like(right), memorized_of(answers, real, twin, level, n_flip, seed),
                          seed, n_sim, steps=steps)


# ----------------------------------------------------------------------------------------------------
# Reading it
# ----------------------------------------------------------------------------------------------------

def power_json(p: Power) -> dict:
    return {"share": p.share, "detects": p.detects, "power": p.power, "reached": p.reached, "n_sim": p.n_sim,
            "target": p.target}


def power_text(p: Power) -> str:
    """The line beside a clause: the smallest difference it detects, or that it detects none."""
    if p.share == 0:
        return ("passes as it stands: no shift to plant" if p.reached else
                "power not read: every answer it could plant into is right already")
    if not p.reached:
        return (f"detects no shift at {p.target:.0%} power: every wrong answer turned right adds {p.detects:+.2f} "
                f"and passes {p.power:.0%} of {p.n_sim} simulations")
    return (f"detects {p.detects:+.2f} at {p.target:.0%} power ({p.share:.2f} of the wrong answers turned right "
            f"passes {p.power:.0%} of {p.n_sim} simulations)")


def null_reading(difference: S.Interval, p: Power, model: str = "XDBERT") -> str:
    """A null clause read with its power: how far the model may have moved, and what the study would see."""
    moved = f"{model} moved less than {difference.high:+.2f} (the interval's upper end)"
    if p.share == 0:
        return f"{moved}; {power_text(p)}"
    if not p.reached:
        return f"{moved}; the study detects no shift at {p.target:.0%} power, even every wrong answer turned right"
    return f"{moved}; the study detects {p.detects:+.2f} ({p.target:.0%} power)"
