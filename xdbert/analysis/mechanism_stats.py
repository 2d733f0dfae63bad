"""The mechanism study's cells, intervals and gates (../shared/MECHANISM.md, "Rows" and "Gates").

Pure numpy. A model's results on a task are `correct` (seeds, examples) bool: per finetuning seed, per dev
example, whether the model was right. On the probe task `vis` every dev example has a kind (F+, F0, T=,
T!=) and an object; the fact-free control task (SST-2) has neither, and there each example is its own unit.

- A cell (model, kind) is the median over seeds of the accuracy on that kind's examples.
- Its interval comes from a two-level bootstrap: draw the kind's objects with replacement, each with all its
  examples, then draw the seeds with replacement; the cell of each replicate is the median over the drawn
  seeds of the accuracy over the drawn objects' examples; the interval is the percentile one. The draws
  depend only on (units, seeds, n_boot, seed), so two models of one cell draw the same objects and seeds:
  a difference of two models is paired, replicate by replicate.
- A cell of fewer than `exact_below` objects (F0 has 8) has too few distinct resamples for a bootstrap;
  it gets an exact interval from the sign-flip test over objects instead (`exact_interval`), and as its
  estimate the mean over objects of each object's accuracy (a median over seeds), the centre that
  interval is for.
- Gates A-E turn these numbers into PASS or FAIL records (`Gate`); `gates_markdown` writes the report's
  table and its one summary sentence.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Mapping, NamedTuple, Sequence

import numpy as np

BOOTSTRAP_OBJECTS = "bootstrap: objects, then seeds"
BOOTSTRAP_EXAMPLES = "bootstrap: examples, then seeds"
EXACT = "exact sign-flip"


class Interval(NamedTuple):
    """A cell or a difference of two cells: the estimate, its interval and how the interval was made."""

    estimate: float
    low: float
    high: float
    method: str


# ----------------------------------------------------------------------------------------------------
# Cells and their intervals
# ----------------------------------------------------------------------------------------------------

def unit_counts(correct: np.ndarray, objects: np.ndarray | None, kinds: np.ndarray | None,
                kind: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The examples of `kind` (all examples where `kind` is None) grouped into units, the objects (each
    example its own unit where `objects` is None): per seed and unit the examples right, `right`
    (seeds, units), and each unit's number of examples, `size` (units,). Units are in sorted order."""
    correct = np.asarray(correct, dtype=bool)
    if correct.ndim != 2 or correct.shape[0] == 0:
        raise ValueError(f"`correct` must be (seeds >= 1, examples) bool; got shape {correct.shape}")
    n = correct.shape[1]
    if kind is None:
        keep = np.ones(n, dtype=bool)
    else:
        if kinds is None or len(kinds) != n:
            raise ValueError(f"kind {kind!r} needs `kinds`, one per example ({n})")
        keep = np.asarray(kinds) == kind
    if not keep.any():
        raise ValueError(f"no example of kind {kind!r}")
    if objects is not None and len(objects) != n:
        raise ValueError(f"`objects` has {len(objects)} entries for {n} examples")
    units = np.arange(n) if objects is None else np.asarray(objects)
    _, unit = np.unique(units[keep], return_inverse=True)
    right = np.stack([np.bincount(unit, weights=row, minlength=unit.max() + 1) for row in correct[:, keep]])
    return right, np.bincount(unit).astype(np.float64)


def point(right: np.ndarray, size: np.ndarray) -> float:
    """The cell: the median over seeds of the accuracy over all the units' examples."""
    return float(np.median(right.sum(1) / size.sum()))


def bootstrap_replicates(right: np.ndarray, size: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The cell on `n_boot` two-level resamples (n_boot,): units drawn with replacement (whole, with all
    their examples), then seeds drawn with replacement; per replicate, the median over the drawn seeds of
    each seed's accuracy over the drawn units' examples. The draws depend on the shapes and `seed` alone,
    so two models with the same units and seeds get the same draws."""
    return resampled(bootstrap_draws(*right.shape, n_boot, seed), right, size)


def bootstrap_draws(n_seeds: int, n_units: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`bootstrap_replicates`' draws: how often each unit was drawn (n_boot, units), the drawn seeds (n_boot, seeds).
    Made once, they serve every array of that shape (the power simulation plants hundreds)."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, n_units, (n_boot, n_units))
    weights = np.zeros((n_boot, n_units))
    np.add.at(weights, (np.arange(n_boot)[:, None], drawn), 1.0)
    return weights, rng.integers(0, n_seeds, (n_boot, n_seeds))


def resampled(draws: tuple[np.ndarray, np.ndarray], right: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The cell on each of `draws` (`bootstrap_draws`), (n_boot,)."""
    weights, seeds = draws
    accuracy = (weights @ right.T) / (weights @ size)[:, None]     # (n_boot, seeds)
    return np.median(np.take_along_axis(accuracy, seeds, axis=1), axis=1)


def exact_interval(values: np.ndarray, level: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """An exact interval for the centre mu of per-object `values` (n,), by inverting the sign-flip test.

    The test of a centre mu flips the signs of values - mu in all 2^n ways and compares each sum with the
    observed one; the interval holds every mu that neither one-sided test rejects at (1 - level) / 2, so
    it covers mu with probability >= level when the values are symmetric about it. Written out
    (Hartigan 1969): a sign flip of the set F gives a sum at least the observed one exactly when the mean
    of the values in F is at most mu, so the upper-tail p is (1 + #{F: mean_F <= mu}) / 2^n, and the
    interval runs from the k-th smallest to the k-th largest of the 2^n - 1 subset means, with
    k = floor((1 - level) / 2 * 2^n). Where k = 0 (5 objects or fewer at 95%) no centre is ever rejected,
    and the interval is `bounds`, all the quantity can be.
    """
    if not 0 < level < 1:
        raise ValueError(f"the level must lie in (0, 1); got {level}")
    sums, counts = np.zeros(1), np.zeros(1)
    for v in np.asarray(values, dtype=np.float64):  # each subset's sum and size, doubling per object
        sums, counts = np.concatenate([sums, sums + v]), np.concatenate([counts, counts + 1])
    means = np.sort(sums[1:] / counts[1:])
    k = int(np.floor((1 - level) / 2 * 2 ** len(values) + 1e-9))
    if k == 0:
        return bounds
    return float(means[k - 1]), float(means[-k])


MONTE_CARLO = "sign-flip, random flips"
ENUMERATED_UP_TO = 16  # objects whose 2^n sign flips are all enumerated; above, random ones


def method_of(n: int) -> str:
    """How `sign_flip_interval` makes its interval for `n` values."""
    return EXACT if n <= ENUMERATED_UP_TO else MONTE_CARLO


def sign_flip_interval(values: np.ndarray, level: float, bounds: tuple[float, float], n_flip: int,
                       seed: int) -> tuple[float, float]:
    """The sign-flip interval for the centre of per-object `values`: `exact_interval` where the 2^n flips can
    be enumerated, else its Monte Carlo form. A flip of the set F reaches the observed sum exactly when
    mean_F <= mu (see `exact_interval`), so with `n_flip` random non-empty sets the interval runs from the
    k-th smallest to the k-th largest of their means, k = floor((1 - level) / 2 * (n_flip + 1)): the
    randomization test inverted, exact in its level for any n_flip (Hartigan 1969)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) <= ENUMERATED_UP_TO:
        return exact_interval(values, level, bounds)
    return flip_interval(values, random_flips(len(values), n_flip, seed), level, bounds)


def random_flips(n: int, n_flip: int, seed: int) -> np.ndarray:
    """`sign_flip_interval`'s random non-empty sets of `n` objects, (n_flip, n) bool."""
    rng = np.random.default_rng(seed)
    flips = rng.random((n_flip, n)) < 0.5
    flips[~flips.any(1), rng.integers(0, n)] = True  # an empty set has no mean: flip one object
    return flips


def flip_interval(values: np.ndarray, flips: np.ndarray, level: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """`sign_flip_interval`'s Monte Carlo form on drawn `flips` (`random_flips`)."""
    means = np.sort((flips @ values) / flips.sum(1))
    k = int(np.floor((1 - level) / 2 * (len(flips) + 1)))
    if k == 0:
        return bounds
    return float(means[k - 1]), float(means[-k])


def per_object(right: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Each unit's accuracy over its examples, the median over seeds first (units,): the exact interval's values."""
    return np.median(right / size, axis=0)


def percentile_interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.percentile(replicates, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def cell(correct: np.ndarray, objects: np.ndarray | None, kinds: np.ndarray | None, kind: str | None, *,
         n_boot: int, level: float, exact_below: int, seed: int) -> Interval:
    """A model's cell on `kind` (the whole split where None) with its interval.

    `correct` (seeds, examples) bool; `objects` and `kinds` (examples,), or None on a task without them.
    From `exact_below` units up, the two-level bootstrap's percentile interval (`bootstrap_replicates`);
    below, the exact sign-flip interval (`exact_interval`) for the centre of the per-object accuracies,
    each a median over seeds, within [0, 1]. The estimate is the cell itself (`point`), but for an exact
    interval the mean of those per-object accuracies: the centre the interval is for. (With seeds that
    disagree, the median over seeds of the pooled accuracy can lie outside an interval for that centre.)
    """
    right, size = unit_counts(correct, objects, kinds, kind)
    if len(size) < exact_below:  # the estimate is the centre the interval is for, so it lies inside it
        values = per_object(right, size)
        return Interval(float(values.mean()), *exact_interval(values, level, (0.0, 1.0)), EXACT)
    estimate = point(right, size)
    replicates = bootstrap_replicates(right, size, n_boot, seed)
    method = BOOTSTRAP_EXAMPLES if objects is None else BOOTSTRAP_OBJECTS
    return Interval(estimate, *percentile_interval(replicates, level), method)


def paired_difference(correct_a: np.ndarray, correct_b: np.ndarray, objects: np.ndarray | None,
                      kinds: np.ndarray | None, kind: str | None, *, n_boot: int, level: float,
                      exact_below: int, seed: int) -> Interval:
    """Model a's cell minus model b's on `kind`, paired: both on the same examples and seeds (seed i of a
    beside seed i of b), and every bootstrap replicate draws the same objects and seeds for both.

    Below `exact_below` units, the exact sign-flip interval (`exact_interval`) over objects, within
    [-1, 1], of the per-object differences: each object's accuracy for a minus that for b, each a median
    over seeds first, and their mean as the estimate. Otherwise the estimate is the difference of the cells.
    """
    if np.shape(correct_a) != np.shape(correct_b):
        raise ValueError(f"a paired difference needs the same seeds and examples; got {np.shape(correct_a)} "
                         f"and {np.shape(correct_b)}")
    (right_a, size), (right_b, _) = (unit_counts(c, objects, kinds, kind) for c in (correct_a, correct_b))
    if len(size) < exact_below:
        values = per_object(right_a, size) - per_object(right_b, size)
        return Interval(float(values.mean()), *exact_interval(values, level, (-1.0, 1.0)), EXACT)
    estimate = point(right_a, size) - point(right_b, size)
    replicates = bootstrap_replicates(right_a, size, n_boot, seed) - bootstrap_replicates(right_b, size, n_boot, seed)
    method = BOOTSTRAP_EXAMPLES if objects is None else BOOTSTRAP_OBJECTS
    return Interval(estimate, *percentile_interval(replicates, level), method)


# ----------------------------------------------------------------------------------------------------
# Gates A-E
# ----------------------------------------------------------------------------------------------------

PASS, FAIL, NOT_REPLICATED = "PASS", "FAIL", "not replicated"
UNINFORMATIVE = "uninformative"  # D where a rung below it failed: the study could not have shown a gain
QUESTIONS = {"M": "the upper reference memorized the facts", "R": "the instrument reads facts that are there",
             "T": "a loss from the tower alone moves them",
             "A": "the facts are in CLIP", "B": "the cross-attention path carries them", "C": "no leakage",
             "D": "the claim: the facts reach the encoder", "E": "Figure 4 calibrated"}


@dataclass(frozen=True)
class Gate:
    """One gate's verdict: its state (PASS, FAIL, or for D "not replicated"), the numbers it was decided
    on in one line, and the difference it reads (A, B, D), whose upper end the summary quotes for D."""

    name: str
    state: str
    numbers: str
    interval: Interval | None = None

    @property
    def passed(self) -> bool:
        return self.state == PASS

    @property
    def text(self) -> str:
        return f"{self.state}: {self.numbers}"


def above_zero(interval: Interval) -> bool:
    """A gain: the whole interval above 0."""
    return interval.low > 0


def fmt(interval: Interval) -> str:
    exact = " (exact)" if interval.method == EXACT else ""
    return f"{interval.estimate:+.2f} [{interval.low:.2f}, {interval.high:.2f}]{exact}"


def fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.0005 else f"{p:.1e}"  # 1/(1 + 1,000 permutations) is 0.001; 1/(1 + 10,000 flips) 1.0e-04


def verdict(passed: bool) -> str:
    return PASS if passed else FAIL


def gate_a(clip_difference: Interval, probe_accuracy: float, probe_p: float, thresholds: Mapping) -> Gate:
    """A, the facts are in CLIP: CLIP-T (facts) minus CLIP-T (twin) on F+ above 0, and the facts tower's
    probe at `probe_layer` above its null (p < alpha_a)."""
    passed = above_zero(clip_difference) and probe_p < thresholds["alpha_a"]
    numbers = (f"CLIP-T(facts) - CLIP-T(twin) on F+ = {fmt(clip_difference)}; "
               f"tower probe {probe_accuracy:.2f}, p {fmt_p(probe_p)}")
    return Gate("A", verdict(passed), numbers, clip_difference)


def gate_b(full_difference: Interval) -> Gate:
    """B, the cross-attention path carries them: full XDBERT minus full `nofacts` on F+ above 0."""
    return Gate("B", verdict(above_zero(full_difference)),
                f"full XDBERT - full nofacts on F+ = {fmt(full_difference)}", full_difference)


def gate_c(probes: Mapping[str, tuple[float, float]], thresholds: Mapping) -> Gate:
    """C, no leakage: every listed probe, name -> (accuracy, p), inside its null (p > alpha_c): the
    model-free corpus probe, the baseline's and pretrain_encoder's, the bag-of-words model."""
    if not probes:
        raise ValueError("gate C needs at least one probe")
    passed = all(p > thresholds["alpha_c"] for _, p in probes.values())
    numbers = "; ".join(f"{name} {accuracy:.2f}, p {fmt_p(p)}" for name, (accuracy, p) in probes.items())
    return Gate("C", verdict(passed), numbers)


class Claim(NamedTuple):
    """What D reads on one facts seed: XDBERT minus `nofacts` on F+, T= and SST-2 (paired differences),
    and the encoder probe's paired sign-flip p (probe.sign_flip_p)."""

    f_plus: Interval
    t_equal: Interval
    sst2: Interval
    flip_p: float


def claim_holds(claim: Claim, alpha: float) -> bool:
    """A gain on F+ that neither T= nor SST-2 shows (their intervals not above 0), seen by the probe too."""
    return (above_zero(claim.f_plus) and not above_zero(claim.t_equal) and not above_zero(claim.sst2)
            and claim.flip_p < alpha)


def fmt_claim(claim: Claim) -> str:
    return (f"F+ {fmt(claim.f_plus)}; T= {fmt(claim.t_equal)}; SST-2 {fmt(claim.sst2)}; "
            f"probe sign-flip p {fmt_p(claim.flip_p)}")


def gate_d(claim: Claim, replication: Claim | None, thresholds: Mapping, failed_rung: str | None = None) -> Gate:
    """D, the claim: XDBERT minus `nofacts` (`claim_holds`) on the study's facts seed; PASS only if it holds
    again with the facts reassigned (`replication`, facts seed 1), "not replicated" where it does not or that
    run is missing; FAIL where the study's seed does not hold. Read only above the ladder: where rung
    `failed_rung` failed, the instrument could not have shown a gain, and D is "uninformative", never FAIL."""
    holds = claim_holds(claim, thresholds["alpha_d"])
    again = replication is not None and claim_holds(replication, thresholds["alpha_d"])
    state = FAIL if not holds else PASS if again else NOT_REPLICATED
    seed1 = "not run" if replication is None else fmt_claim(replication)
    numbers = f"XDBERT - nofacts: {fmt_claim(claim)}; facts seed 1: {seed1}"
    if failed_rung is not None:
        return Gate("D", UNINFORMATIVE, f"rung {failed_rung} failed, so D is not read; {numbers}", claim.f_plus)
    return Gate("D", state, numbers, claim.f_plus)


def rung_m(reference: Mapping, baseline: Mapping, thresholds: Mapping) -> Gate:
    """M, memorized: the upper reference, asked each captioned object's fact with its own MLM head in frames no
    caption uses (`analysis.cloze.memorized`), answers the real table more often than the twin's (the interval
    of real minus twin over objects above 0) with a real-table accuracy of at least `m_accuracy`; the baseline,
    which never read a fact, inside the same null (its interval holds 0)."""
    d, b = reference["difference"], baseline["difference"]
    passed = (above_zero(d) and reference["real_accuracy"] >= thresholds["m_accuracy"]
              and b.low <= 0 <= b.high)
    numbers = (f"caption_mlm real - twin table {fmt(d)}, real-table accuracy {reference['real_accuracy']:.2f} "
               f"(threshold {thresholds['m_accuracy']:.2f}); baseline {fmt(b)}")
    return Gate("M", verdict(passed), numbers, d)


def rung_r(vis_difference: Interval, probe_difference: float, probe_p: float, thresholds: Mapping) -> Gate:
    """R, readable: the upper reference beside its twin (`caption_mlm` minus `caption_mlm_nofacts`, one recipe on
    two tables) on `vis` F+ (interval above 0) and on the representation probe (paired sign-flip p over objects
    below alpha_r): the instrument sees facts that are in an encoder."""
    passed = above_zero(vis_difference) and probe_p < thresholds["alpha_r"]
    numbers = (f"caption_mlm - caption_mlm_nofacts on F+ = {fmt(vis_difference)}; probe {probe_difference:+.2f}, "
               f"sign-flip p {fmt_p(probe_p)}")
    return Gate("R", verdict(passed), numbers, vis_difference)


def rung_t(forms: Mapping[str, tuple[Interval, float, float]], thresholds: Mapping) -> Gate:
    """T, the transfer path can carry them: an encoder-side control that distils the tower, beside the same
    control distilling the twin tower, on `vis` F+ (interval above 0) and on the probe (paired sign-flip p below
    alpha_t): a loss from the tower to the encoder, with no caption read, can move the facts. `forms`: each
    control's name -> (F+ difference, probe difference, probe p); T reads the stronger, the larger probe
    difference (a rule fixed before any reading). Not a precondition of D: it tells whether a null D is the
    path's or the recipe's."""
    name = stronger_form(forms)
    vis_difference, probe_difference, probe_p = forms[name]
    passed = above_zero(vis_difference) and probe_p < thresholds["alpha_t"]
    numbers = "; ".join(f"{k} - {k}_nofacts on F+ = {fmt(v)}, probe {d:+.2f} (sign-flip p {fmt_p(p)})"
                        for k, (v, d, p) in sorted(forms.items(), key=lambda x: x[0] != name))
    return Gate("T", verdict(passed), f"{numbers}; read: {name}", vis_difference)


def stronger_form(forms: Mapping[str, tuple[Interval, float, float]]) -> str:
    """The control rung T reads (`rung_t`'s `forms`): the larger probe difference, then the larger F+ estimate."""
    if not forms:
        raise ValueError("rung T needs at least one control")
    return max(forms, key=lambda k: (forms[k][1], forms[k][0].estimate))


def failed_rung(ladder: Sequence[Gate]) -> str | None:
    """The first rung of M and R that failed (D is read above them alone), or None."""
    return next((r.name for r in ladder if r.name in "MR" and not r.passed), None)


def fisher_greater(improved_f_plus: int, improved_f0: int, worsened_f_plus: int, worsened_f0: int) -> float:
    """One-sided Fisher exact p that improved examples are richer in F+ than worsened ones: with the
    table's margins fixed (hypergeometric), the chance of at least this many F+ among the improved."""
    f_plus, improved = improved_f_plus + worsened_f_plus, improved_f_plus + improved_f0
    n = improved + worsened_f_plus + worsened_f0
    tail = sum(comb(f_plus, x) * comb(n - f_plus, improved - x) for x in range(improved_f_plus, improved + 1))
    return tail / comb(n, improved)


def gate_e(improved_f_plus: int, improved_f0: int, worsened_f_plus: int, worsened_f0: int,
           thresholds: Mapping) -> Gate:
    """E, Figure 4 calibrated: among the F examples XDBERT improves over `nofacts`, a larger share of F+
    (facts CLIP knows) than among those it worsens; F0 (facts nobody knows) is the rest. One-sided Fisher
    exact test (`fisher_greater`), p < alpha_e."""
    p = fisher_greater(improved_f_plus, improved_f0, worsened_f_plus, worsened_f0)
    numbers = (f"F+ among improved {improved_f_plus}/{improved_f_plus + improved_f0}, among worsened "
               f"{worsened_f_plus}/{worsened_f_plus + worsened_f0}; one-sided Fisher p {fmt_p(p)}")
    return Gate("E", verdict(p < thresholds["alpha_e"]), numbers)


# ----------------------------------------------------------------------------------------------------
# The report's gates table
# ----------------------------------------------------------------------------------------------------

def summary(records: Sequence[Gate], reference: Interval | None = None) -> str:
    """The one sentence the design asks for: what the first failing gate of A-C means, else D's reading.
    With a null D, `reference` (the upper reference minus the baseline on F+: the caption-text control, which
    reads the facts directly) says whether the null is the recipe's or the encoder and task cannot show the
    facts at all."""
    by_name = {r.name: r for r in records}
    missing = [n for n in "ABCD" if n not in by_name]
    if missing:
        raise ValueError(f"the summary needs gates A-D; missing {', '.join(missing)}")
    a, b, c, d = (by_name[n] for n in "ABCD")
    if not a.passed:
        return "A fails: the CLIP stand-in does not hold the facts; fix it before reading the other gates."
    if not b.passed:
        return "A passes, B fails: a pipeline defect; the cross-attention path does not carry CLIP's facts."
    if not c.passed:
        return "C fails: the study is invalid until the leak is found."
    if d.state == UNINFORMATIVE:
        return (f"A-C pass, D uninformative: {d.numbers.split(';')[0]}: the instrument could not have shown facts "
                f"reaching the encoder, so D says nothing about the recipe.")
    if d.state == NOT_REPLICATED:
        return ("A-C pass, D not replicated: the facts reached the encoder on facts seed 0, but not again with "
                "the facts reassigned.")
    if d.passed:
        return "A-D pass: the recipe moved the facts into the encoder, again with the facts reassigned."
    null = (f"A-C pass, D null: the recipe did not move the facts into the encoder; the interval's upper end "
            f"is {d.interval.high:+.2f}.")
    if reference is None:
        return null
    shown = f"{reference.estimate:+.2f} [{reference.low:+.2f}, {reference.high:+.2f}]"
    if reference.low > 0:
        return (f"{null} The upper reference, the encoder trained on the captions that state the facts, beats the "
                f"baseline on F+ by {shown}: the encoder and task can show the facts, so the null is the recipe's.")
    return (f"{null} The upper reference, the encoder trained on the captions that state the facts, does not beat "
            f"the baseline on F+ either ({shown}): the encoder and task do not show the facts even read directly, "
            f"so the null says little about the recipe.")


def records_table(records: Sequence[Gate], what: str = "gate") -> str:
    """Gates or rungs as a markdown table: name, what it tests, PASS/FAIL, the numbers."""
    lines = [f"| {what} | tests | result | numbers |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {QUESTIONS[r.name]} | {r.state} | {r.numbers} |" for r in records]
    return "\n".join(lines) + "\n"


def gates_markdown(records: Sequence[Gate], reference: Interval | None = None) -> str:
    """The gates as a markdown table (`records_table`), then the summary."""
    return records_table(records) + "\n" + summary(records, reference) + "\n"
