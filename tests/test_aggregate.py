"""The paired bootstrap behind the tables' Δ rows."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.reports.aggregate import bootstrap_replicates, compare, paired_bootstrap

RTE = get_task("rte")


def predictions(correct: np.ndarray, seeds=(0, 1, 2), idx: np.ndarray | None = None) -> pd.DataFrame:
    """RTE-style predictions: label 1 everywhere, prediction right where `correct` is True (every seed)."""
    n = len(correct)
    idx = np.arange(n) if idx is None else idx
    return pd.concat([pd.DataFrame({"split": "dev", "idx": idx, "seed": s, "label": 1,
                                    "prediction": correct.astype(int)}) for s in seeds], ignore_index=True)


def test_same_predictions_give_zero_and_better_ones_a_significant_gain():
    rng = np.random.default_rng(0)
    half = rng.random(200) < 0.5
    base = predictions(half)
    same = paired_bootstrap(base, base, RTE, n_boot=50)
    assert same["delta"] == 0 and same["ci_low"] == 0 and same["ci_high"] == 0 and not same["significant"]

    better = predictions(half | (rng.random(200) < 0.5))  # right wherever the baseline is, and more
    gain = better["prediction"].mean() - half.mean()
    d = paired_bootstrap(better, base, RTE, n_boot=50)
    assert gain > 0 and d["delta"] == pytest.approx(gain)
    assert d["ci_low"] > 0 and d["significant"] and d["ours_better"]


def test_cached_replicates_give_the_same_interval_and_refuse_other_examples():
    rng = np.random.default_rng(1)
    a, b = predictions(rng.random(100) < 0.7), predictions(rng.random(100) < 0.5)
    direct = paired_bootstrap(a, b, RTE, n_boot=40, seed=3)
    ra, rb = bootstrap_replicates(a, RTE, 40, 3), bootstrap_replicates(b, RTE, 40, 3)
    assert compare(ra, rb) == direct
    other = bootstrap_replicates(predictions(rng.random(100) < 0.5, idx=np.arange(100) + 1), RTE, 40, 3)
    with pytest.raises(PipelineError, match="different dev examples"):
        compare(ra, other)


def test_adaptation_table_shows_match_beside_its_majority_class():
    from xdbert.reports.tables import adaptation_table

    table = adaptation_table({
        "xdbert": {"steps": 32, "valid_mlm_accuracy": 0.27, "valid_mlm_perplexity": 94.0, "valid_match_accuracy": 0.54,
                   "valid_match_majority": 0.54, "valid_cliptc_accuracy": 0.295},
        "mlm": {"steps": 32, "valid_mlm_accuracy": 0.268, "valid_mlm_perplexity": 85.1},
    })
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| variant | steps | MLM acc. | MLM ppl. | MATCH acc. | MATCH majority | CLIPTC acc. |"
    assert rows[2] == "| xdbert | 32 | 0.270 | 94.0 | 0.540 | 0.540 | 0.295 |"
    assert rows[3] == "| mlm | 32 | 0.268 | 85.1 | - | - | - |"  # a loss the variant does not train: a dash
