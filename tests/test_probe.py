"""The representation probe (xdbert/analysis/probe.py): the closed-form leave-one-object-out ridge against a
brute-force refit, the null's accuracies over many class assignments (a free shuffle here; the study's
re-drawn fact tables: tests/test_mechanism_probe_null.py), and the paired sign-flip test."""
import numpy as np
import pytest

from xdbert.analysis import probe

K = 4  # attributes


def brute_force_loo(features: np.ndarray, classes: np.ndarray, lam: float) -> np.ndarray:
    """Scores (n, K): for each object, ridge with an unpenalized intercept refitted on the other objects in
    the primal form, then applied to it. Standardized as the probe does: over all objects, no class used."""
    x = features[:, features.std(0) > 1e-12]
    x = (x - x.mean(0)) / x.std(0)
    z = np.hstack([np.ones((len(x), 1)), x])
    penalty = lam * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    y = np.eye(K)[classes]
    scores = np.empty_like(y)
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        coef = np.linalg.solve(z[keep].T @ z[keep] + penalty, z[keep].T @ y[keep])
        scores[i] = z[i] @ coef
    return scores


@pytest.mark.parametrize("n, width", [(24, 40), (30, 6)])  # wider than the objects (the kernel form's case), and narrower
def test_leave_one_out_equals_a_refit(n, width):
    rng = np.random.default_rng(n)
    features = rng.normal(size=(n, width)) * rng.uniform(0.1, 10, width) + rng.normal(size=width)
    features[:, 3] = 2.5  # a column that does not vary: dropped by both
    classes = np.arange(n) % K
    closed = probe.loo_predictions(probe.hat_matrix(features, 10.0), probe.onehot(classes, K))
    np.testing.assert_allclose(closed, brute_force_loo(features, classes, 10.0), atol=1e-10, rtol=0)


def test_null_accuracies_score_each_assignment_as_the_probe_does():
    rng = np.random.default_rng(3)
    features = rng.normal(size=(30, 8))
    assignments = np.stack([rng.permutation(np.arange(30) % K) for _ in range(5)])
    expected = [probe.loo_correct(features, y, K, 10.0).mean() for y in assignments]
    np.testing.assert_allclose(probe.null_accuracies(features, assignments, K, 10.0), expected, atol=0, rtol=0)


def shuffles(classes: np.ndarray, n: int) -> np.ndarray:
    """`n` free shuffles of `classes` over the objects (each class keeps its count)."""
    rng = np.random.default_rng(0)
    return np.stack([rng.permutation(classes) for _ in range(n)])


def test_the_null_on_random_features_is_near_chance():
    """Leaving an object out leaves its class one short among the fitted objects, so the null sits a little
    below 1/K (0.24 here): the reason the probe is read against its null, not against chance."""
    rng = np.random.default_rng(0)
    features, classes = rng.normal(size=(72, 64)), np.arange(72) % K
    null = probe.null_accuracies(features, shuffles(classes, 1000), K, 10.0)
    assert null.shape == (1000,)
    assert null.mean() == pytest.approx(1 / K, abs=0.03)
    assert probe.p_above(float(probe.loo_correct(features, classes, K, 10.0).mean()), null) > 0.05


def test_a_planted_linear_signal_gives_the_smallest_p():
    rng = np.random.default_rng(1)
    classes = rng.permutation(np.arange(72) % K)
    features = np.eye(K)[classes] @ rng.normal(size=(K, 64)) + 0.3 * rng.normal(size=(72, 64))
    accuracy = float(probe.loo_correct(features, classes, K, 10.0).mean())
    null = probe.null_accuracies(features, shuffles(classes, 1000), K, 10.0)
    assert accuracy == 1.0
    assert probe.p_above(accuracy, null) == 1 / 1001


def test_p_above_counts_the_observed_draw_and_ties():
    null = np.array([0.1, 0.2, 0.3, 0.3])
    assert probe.p_above(0.3, null) == 3 / 5
    assert probe.p_above(0.31, null) == 1 / 5


def test_sign_flips_of_no_difference_give_one_and_of_a_strong_one_the_minimum():
    a = np.random.default_rng(2).random(40)
    assert probe.sign_flip_p(a, a, 10000, seed=0) == 1.0
    assert probe.sign_flip_p(a + 0.5, a, 10000, seed=0) == 1 / 10001
    assert probe.sign_flip_p(a, a + 0.5, 10000, seed=0) == 1.0  # one-sided: a worse `a` is no evidence
