"""Task metrics against direct scikit-learn / scipy calls, and the errors for malformed predictions."""
import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

from xdbert.data.tasks import TASK_NAMES, compute_metrics, get_task
from xdbert.errors import PipelineError

rng = np.random.default_rng(0)


def _classes(k: int, n: int = 97) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, k, n)
    p = np.where(rng.random(n) < 0.7, y, rng.integers(0, k, n))  # mostly right, so metrics are not degenerate
    return p, y


def test_accuracy_tasks_match_sklearn():
    for task, k in (("rte", 2), ("sst2", 2), ("qnli", 2), ("swag", 4)):
        p, y = _classes(k)
        assert compute_metrics(task, p, y) == {"accuracy": accuracy_score(y, p)}


def test_mnli_matched_and_mismatched_are_scored_separately():
    pm, ym = _classes(3)
    pmm, ymm = _classes(3, 61)
    matched, mismatched = compute_metrics("mnli", pm, ym), compute_metrics("mnli", pmm, ymm)
    assert matched["accuracy"] == accuracy_score(ym, pm)
    assert mismatched["accuracy"] == accuracy_score(ymm, pmm)
    assert matched != mismatched


def test_mrpc_and_qqp_f1_of_the_positive_class():
    p, y = _classes(2)
    m = compute_metrics("mrpc", p, y)
    assert list(m) == ["f1", "accuracy"]  # headline first
    assert m["f1"] == f1_score(y, p) and m["accuracy"] == accuracy_score(y, p)
    q = compute_metrics("qqp", p, y)
    assert q["accuracy"] == accuracy_score(y, p) and q["f1"] == f1_score(y, p, pos_label=1)


def test_cola_matthews():
    p, y = _classes(2)
    m = compute_metrics("cola", p, y)
    assert m["matthews"] == matthews_corrcoef(y, p) and m["accuracy"] == accuracy_score(y, p)



def test_only_the_named_metrics_are_computed_and_unknown_names_are_refused():
    p, y = _classes(2)
    assert compute_metrics("mrpc", p, y, ["f1"]) == {"f1": compute_metrics("mrpc", p, y)["f1"]}
    with pytest.raises(PipelineError, match="rte has no metric f1; it reports accuracy"):
        compute_metrics("rte", p, y, ["f1"])

def test_stsb_correlations_and_column_predictions():
    y = rng.uniform(0, 5, 80)
    p = y + rng.normal(0, 1, 80)
    m = compute_metrics("stsb", p, y)
    assert m["spearman"] == pytest.approx(spearmanr(p, y)[0], abs=1e-12)
    assert m["pearson"] == pytest.approx(pearsonr(p, y)[0], abs=1e-12)
    assert compute_metrics("stsb", p[:, None], y) == m  # (n, 1) regression output
    # a constant prediction has no correlation: NaN, not a made-up number
    assert math.isnan(compute_metrics("stsb", np.full(80, 2.5), y)["spearman"])


def test_read_rmse():
    y = rng.normal(-1, 1, 50)
    p = y + rng.normal(0, 0.5, 50)
    m = compute_metrics("read", p, y)
    assert m == {"rmse": pytest.approx(math.sqrt(mean_squared_error(y, p)), abs=1e-12)}
    assert m["rmse"] == pytest.approx(float(np.sqrt(np.mean((p - y) ** 2))), abs=1e-12)
    assert get_task("read").higher_is_better is False and get_task("read").metric == "rmse"


def test_logits_are_argmaxed():
    logits = rng.normal(size=(40, 3))
    y = rng.integers(0, 3, 40)
    assert compute_metrics("mnli", logits, y) == {"accuracy": accuracy_score(y, logits.argmax(1))}
    swag = rng.normal(size=(40, 4))
    y4 = rng.integers(0, 4, 40)
    assert compute_metrics("swag", swag, y4)["accuracy"] == accuracy_score(y4, swag.argmax(1))


@pytest.mark.parametrize("task,pred,labels,message", [
    ("rte", [0, 1, 1], [0, 1], "shape"),
    ("rte", np.zeros((4, 3)), [0, 1, 1, 0], "shape"),            # 3 logits for a 2-class task
    ("mnli", np.zeros((2, 3, 1)), [0, 1], "shape"),
    ("stsb", np.zeros((3, 2)), [1.0, 2.0, 3.0], "shape"),
    ("rte", [0, 2], [0, 1], "0..1"),                              # a class that does not exist
    ("cola", [0.5, 1], [0, 1], "integers"),
    ("read", [float("nan"), 1.0], [0.0, 1.0], "NaN"),
    ("qnli", [], [], "empty"),
    ("sst2", [0, 1], [-1, 1], "label -1"),                        # GLUE test labels cannot be scored
])
def test_malformed_inputs_are_pipeline_errors(task, pred, labels, message):
    with pytest.raises(PipelineError, match=message):
        compute_metrics(task, pred, labels)


def test_unknown_task_lists_the_allowed_ones():
    with pytest.raises(PipelineError) as e:
        compute_metrics("squad", [0], [0])
    assert all(name in str(e.value) for name in TASK_NAMES)


def test_every_task_reports_its_headline_first():
    for name in TASK_NAMES:
        spec = get_task(name)
        assert spec.metrics[0] == spec.metric
        k = spec.num_labels
        if spec.kind == "regression":
            y = rng.uniform(0, 5, 30)
            m = compute_metrics(name, y + rng.normal(0, 1, 30), y)
        else:
            p, y = _classes(k, 30)
            m = compute_metrics(name, p, y)
        assert list(m) == list(spec.metrics)


@pytest.mark.parametrize("task", ["rte", "mrpc", "cola", "mnli", "swag", "stsb", "read"])
def test_resampled_metrics_equal_one_library_call_per_resample(task):
    """The bootstrap's vectorised metrics give, resample by resample, what compute_metrics gives."""
    from xdbert.data.tasks.metrics import resampled_metric

    spec = get_task(task)
    if spec.kind == "regression":
        y = rng.uniform(0, 5, 60).round(1)  # rounded: ties, which Spearman averages
        p = y + rng.normal(0, 1, 60).round(1)
    else:
        p, y = _classes(spec.num_labels, 60)
    samples = rng.integers(0, 60, (30, 60))
    samples[0] = 0  # one example only: constant predictions and labels (F1 0, MCC 0, correlations NaN)
    for name in spec.metrics:
        got = resampled_metric(task, name, p, y, samples)
        want = [compute_metrics(task, p[s], y[s], [name])[name] for s in samples]
        assert got.shape == (30,)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True)
        single = resampled_metric(task, name, p, y, samples[1:2])  # one resample: no special case shows
        np.testing.assert_allclose(single, want[1:2], rtol=1e-10, atol=1e-12)
