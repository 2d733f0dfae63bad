"""The paired bootstrap behind the tables' Δ rows, and the tables it goes into: rows per encoder family."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from xdbert import io
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.control.predictions import read_predictions
from xdbert.profiles import values
from xdbert.reports.aggregate import bootstrap_replicates, compare
from xdbert.reports.settings import AggregateSettings

RTE = get_task("rte")


def predictions(correct: np.ndarray, seeds=(0, 1, 2), idx: np.ndarray | None = None) -> pd.DataFrame:
    """RTE-style predictions: label 1 everywhere, prediction right where `correct` is True (every seed)."""
    n = len(correct)
    idx = np.arange(n) if idx is None else idx
    return pd.concat([pd.DataFrame({"split": "dev", "idx": idx, "seed": s, "label": 1, "prediction": correct.astype(int),
                                    "correct": correct}) for s in seeds], ignore_index=True)


def paired_bootstrap(ours: pd.DataFrame, base: pd.DataFrame, n_boot: int, seed: int = 0) -> dict:
    """What a table's Δ row computes for two runs of RTE."""
    return compare(bootstrap_replicates(ours, RTE, n_boot, seed), bootstrap_replicates(base, RTE, n_boot, seed))


def test_same_predictions_give_zero_and_better_ones_a_significant_gain():
    rng = np.random.default_rng(0)
    half = rng.random(200) < 0.5
    base = predictions(half)
    same = paired_bootstrap(base, base, n_boot=50)
    assert same["delta"] == 0 and same["ci_low"] == 0 and same["ci_high"] == 0 and not same["significant"]

    better = predictions(half | (rng.random(200) < 0.5))  # right wherever the baseline is, and more
    gain = better["prediction"].mean() - half.mean()
    d = paired_bootstrap(better, base, n_boot=50)
    assert gain > 0 and d["delta"] == pytest.approx(gain)
    assert d["ci_low"] > 0 and d["significant"] and d["ours_better"]


def test_replicates_are_paired_and_refuse_other_examples_naming_both_files(tmp_path):
    rng = np.random.default_rng(1)
    a, b = predictions(rng.random(100) < 0.7), predictions(rng.random(100) < 0.5)
    ra, rb = bootstrap_replicates(a, RTE, 40, 3), bootstrap_replicates(b, RTE, 40, 3)
    assert compare(ra, rb) == compare(ra, bootstrap_replicates(b, RTE, 40, 3))  # drawn again: the same resamples
    path = tmp_path / "xdbert" / "predictions.parquet"
    path.parent.mkdir()
    io.write_parquet(pa.Table.from_pandas(predictions(rng.random(100) < 0.5, idx=np.arange(100) + 1), preserve_index=False), path)
    other = bootstrap_replicates(read_predictions(path), RTE, 40, 3)
    with pytest.raises(PipelineError, match=f"rte: predictions and {path} cover different dev examples"):
        compare(ra, other)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.drop(columns="label"), r"lacks columns \['label'\]"),
    (lambda p: pd.concat([p, p.iloc[:1]]), "has an example twice for one seed"),
    (lambda p: p[(p["seed"] != 1) | (p["idx"] != 5)], "its seeds cover different dev examples of dev"),
])
def test_damaged_predictions_are_refused_naming_the_file(tmp_path, damage, message):
    path = tmp_path / "predictions.parquet"
    io.write_parquet(pa.Table.from_pandas(damage(predictions(np.arange(20) < 12)), preserve_index=False), path)
    with pytest.raises(PipelineError, match=f"{path}:? {message}.*rerun its finetune stage"):
        read_predictions(path)


def test_adaptation_table_shows_match_beside_its_majority_class():
    from xdbert.reports.tables import adaptation_table

    table = adaptation_table({
        "xdbert": {"steps": 32, "valid_mlm_accuracy": 0.27, "valid_mlm_perplexity": 94.0, "valid_match_accuracy": 0.54,
                   "valid_match_majority": 0.54, "valid_cliptc_accuracy": 0.295},
        "mlm": {"steps": 32, "valid_mlm_accuracy": 0.268, "valid_mlm_perplexity": 85.1},
    }, "bert")
    assert "## Adaptation (held-out valid windows, metrics/adapt/bert/<variant>.json)" in table
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| variant | steps | MLM acc. | MLM ppl. | MATCH acc. | MATCH majority | CLIPTC acc. |"
    assert rows[2] == "| xdbert | 32 | 0.270 | 94.0 | 0.540 | 0.540 | 0.295 |"
    assert rows[3] == "| mlm | 32 | 0.268 | 85.1 | - | - | - |"  # a loss the variant does not train: a dash


# ----------------------------------------------------------------------------------------------------
# The tables, family by family
# ----------------------------------------------------------------------------------------------------

N = 100  # dev examples of every fixture run: right on the first `n` of them, on every seed
# Correct answers per run (results/finetune/<task>/<run>): the Δs differ from family to family, so a Δ taken
# against the wrong family's baseline shows.
CORRECT = {
    "rte": {"clip_t": 40, "bert/baseline": 50, "bert/xdbert": 60, "bert/full_xdbert": 55, "bert/mlm": 45,
            "electra/baseline": 70, "electra/xdbert": 75, "electra/full_xdbert": 80},
    "sst2": {"bert/baseline": 50, "bert/xdbert": 58, "bert/full_xdbert": 50,
             "electra/baseline": 60, "electra/xdbert": 70, "electra/full_xdbert": 62},
}
MLM_HEADS = {"bert": "pretrained:bert-base-uncased", "electra": "random"}
# What `count_parameters` gives for BERT-base and ELECTRA-base (no pooler) joined to ViT-B-32's text tower
CLIP_PARAMETERS, CROSS_PARAMETERS = 63_428_097, 2 * 14_574_336
PARAMETERS = {family: {"encoder": n, "clip": CLIP_PARAMETERS, "cross": CROSS_PARAMETERS, "heads": 1_000,
                       "backbone": n + CLIP_PARAMETERS + CROSS_PARAMETERS, "all": n + CLIP_PARAMETERS + CROSS_PARAMETERS + 1_000}
              for family, n in (("bert", 109_482_240), ("electra", 108_891_648))}
ADAPT_METRICS = {"steps": 10, "valid_mlm_accuracy": 0.3, "valid_mlm_perplexity": 50.0}


def two_families(profile: str = "embedded") -> dict:
    """The embedded params with two families, `bert` (still `adapt.family` and the PWCCA pairs' name) and
    `electra`, on RTE and SST2; Table 3 has one ablation, `mlm`, on RTE."""
    p = values("embedded")
    p["profile"] = profile
    p["families"] = {"bert": {"label": "BERT-b", "size": "base", "layer_lr_decay": 1.0},
                     "electra": {"label": "ELECTRA-b", "encoder": "google/electra-base-discriminator", "size": "base",
                                 "layer_lr_decay": 0.8}}
    p["tasks"]["names"] = ["rte", "sst2"]
    p["finetune"].update(ablations=["mlm"], ablation_tasks=["rte"], clip_tasks=["rte"])
    p["aggregate"]["n_boot"] = 50
    return p


@pytest.fixture
def outputs(tmp_path):
    """(finetune dir, adapt metrics dir) as the finetune and adapt stages leave them for `two_families`:
    electra has no Table 3 runs nor metrics, so a Table 3 that looked there would fail."""
    finetune, adapt = tmp_path / "finetune", tmp_path / "adapt"
    for task, runs in CORRECT.items():
        for run, n in runs.items():
            path = finetune / task / run / "predictions.parquet"
            path.parent.mkdir(parents=True)
            io.write_parquet(pa.Table.from_pandas(predictions(np.arange(N) < n), preserve_index=False), path)
    for family, head in MLM_HEADS.items():
        io.write_json(adapt / family / "xdbert.json", {"family": family, "mlm_head": head, **ADAPT_METRICS,
                                                        "parameters": PARAMETERS[family]})
    for variant in ("baseline", "mlm"):
        io.write_json(adapt / "bert" / f"{variant}.json", {"family": "bert", **ADAPT_METRICS})
    return finetune, adapt


def rows(markdown: str) -> list[str]:
    """The table's rows (header and rule left out): the first cell of each line of the results table."""
    table = markdown.split("\n\n| model |")[1].split("\n\n")[0]
    return [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]]


def test_each_family_has_its_rows_and_each_delta_is_against_its_own_baseline(outputs):
    from xdbert.reports.headline import headline
    from xdbert.reports.tables import render, tables_metrics

    reports, results = render(AggregateSettings.from_params(two_families()), *outputs)
    assert rows(reports["table1"]) == ["CLIP-T", "BERT-b", "XDBERT-b", "↳ Δ vs BERT-b", "ELECTRA-b", "XDELECTRA-b",
                                       "↳ Δ vs ELECTRA-b"]
    t1 = results["table1"]
    assert list(t1) == ["CLIP-T", "BERT-b", "XDBERT-b", "ELECTRA-b", "XDELECTRA-b"]
    assert list(t1["CLIP-T"]) == ["rte"] and t1["CLIP-T"]["rte"]["median"] == pytest.approx(0.40)
    assert t1["ELECTRA-b"]["sst2"]["median"] == pytest.approx(0.60) and "vs_baseline" not in t1["ELECTRA-b"]["rte"]
    # XDELECTRA-b against ELECTRA-b (+5 on RTE), not against BERT-b (+25)
    expected = {("XDBERT-b", "rte"): 0.10, ("XDBERT-b", "sst2"): 0.08, ("XDELECTRA-b", "rte"): 0.05,
                ("XDELECTRA-b", "sst2"): 0.10}
    for (row, task), delta in expected.items():
        d = t1[row][task]["vs_baseline"]
        assert d["delta"] == pytest.approx(delta) and d["ci_low"] > 0 and d["significant"], (row, task, d)
    delta_rte = re.compile(r"\| ↳ Δ vs ELECTRA-b \| \+5\.00\* <sub>\[\+\d\.\d\d, \+\d+\.\d\d\]</sub> \| \+10\.00\* ")
    assert delta_rte.search(reports["table1"]), reports["table1"]
    assert "- models: encoders BERT-b `random:bert` (pretrained on the corpus by `pretrain_encoder@bert`), ELECTRA-b " \
           "`google/electra-base-discriminator`; CLIP" in reports["table1"]
    note = reports["table1"].split("## MLM head at the start of adaptation\n\n")[1].split("\n\n")[0].splitlines()
    assert note == ["- BERT-b: copied from the pretrained MLM head of `bert-base-uncased`",
                    "- ELECTRA-b: random: its checkpoint ships no MLM head (as ELECTRA discriminators: theirs is the "
                    "separate generator's, which is not loaded)"]

    assert rows(reports["table8"]) == ["BERT-b", "XDBERT-b", "↳ Δ vs BERT-b", "XBERT-b", "↳ Δ vs BERT-b", "ELECTRA-b",
                                       "XDELECTRA-b", "↳ Δ vs ELECTRA-b", "XELECTRA-b", "↳ Δ vs ELECTRA-b"]
    t8 = results["table8"]
    assert t8["XBERT-b"]["rte"]["vs_baseline"]["delta"] == pytest.approx(0.05)
    assert t8["XBERT-b"]["sst2"]["vs_baseline"]["delta"] == pytest.approx(0.0)
    assert t8["XELECTRA-b"]["rte"]["vs_baseline"]["delta"] == pytest.approx(0.10)
    assert t8["XELECTRA-b"]["sst2"]["vs_baseline"]["delta"] == pytest.approx(0.02)
    assert t8["XDELECTRA-b"]["rte"]["vs_baseline"] == t1["XDELECTRA-b"]["rte"]["vs_baseline"]  # the same replicates

    # Table 3: the ablation family's runs alone, its rows labelled by variant, on the ablation tasks
    assert "# Table 3: adaptation ablations (BERT-b)" in reports["table3"]
    assert rows(reports["table3"]) == ["baseline", "xdbert", "↳ Δ vs baseline", "mlm", "↳ Δ vs baseline"]
    t3 = results["table3"]
    assert all(list(cells) == ["rte"] for cells in t3.values())
    assert {row: cells["rte"]["median"] for row, cells in t3.items()} == pytest.approx(
        {"baseline": 0.50, "xdbert": 0.60, "mlm": 0.45})
    assert t3["mlm"]["rte"]["vs_baseline"]["delta"] == pytest.approx(-0.05)
    assert "metrics/adapt/bert/<variant>.json" in reports["table3"]
    assert "\n| mlm | 10 | 0.300 | 50.0 | - | - | - |" in reports["table3"]
    assert tables_metrics(results)["table1"]["XDELECTRA-b"] == {"rte": 0.75, "sst2": 0.70}
    assert tables_metrics(results)["table8"]["XBERT-b"] == {"rte": t8["XBERT-b"]["rte"]["median"],
                                                            "sst2": t8["XBERT-b"]["sst2"]["median"]}
    # metrics/headline.json: each table's Δ cells above, in points; Table 8's whole models alone
    assert headline(results, None) == pytest.approx({"t1_gain": (10 + 8 + 5 + 10) / 4, "t3_gain": (10 - 5) / 2,
                                                     "t8_gain": (5 + 0 + 10 + 2) / 4})
    assert "*paper:" not in reports["table1"]  # the paper's numbers are the paper profile's


def test_paper_rows_sit_under_the_rows_they_belong_to(outputs):
    from xdbert.reports.tables import render

    reports, _ = render(AggregateSettings.from_params(two_families("paper")), *outputs)
    assert rows(reports["table1"]) == [
        "CLIP-T", "*paper: CLIP-T*", "BERT-b", "*paper: BERT-b*", "XDBERT-b", "↳ Δ vs BERT-b", "*paper: XDBERT-b*",
        "ELECTRA-b", "*paper: ELECTRA-b*", "XDELECTRA-b", "↳ Δ vs ELECTRA-b", "*paper: XDELECTRA-b*",
        "*paper: ELECTRA-l*", "*paper: XDELECTRA-l*"]  # the paper's rows of a family the study does not have: last
    lines = reports["table1"].splitlines()
    assert "| *paper: XDELECTRA-b* | *80.51* | *95.20* |" in lines and "| *paper: CLIP-T* | *51.62* | - |" in lines
    assert rows(reports["table8"]) == [
        "BERT-b", "XDBERT-b", "↳ Δ vs BERT-b", "XBERT-b", "↳ Δ vs BERT-b", "*paper: XBERT-b*", "ELECTRA-b", "XDELECTRA-b",
        "↳ Δ vs ELECTRA-b", "XELECTRA-b", "↳ Δ vs ELECTRA-b", "*paper: XELECTRA-b*", "*paper: XELECTRA-l*"]
    assert "| *paper: XELECTRA-b* | *79.78* | *95.06* |" in reports["table8"].splitlines()
    # Table 3: the paper's row, under its own name, beneath the variant that reproduces it; the others close the table
    assert rows(reports["table3"]) == [
        "baseline", "xdbert", "↳ Δ vs baseline", "*paper: MLM+MATCH+CLIPTC (proposed)*", "mlm", "↳ Δ vs baseline",
        "*paper: MLM*", "*paper: MLM+MATCH*", "*paper: 1 cross-attention layer*", "*paper: 2 epochs*", "*paper: 20 epochs*"]
    assert "| *paper: MLM* | *68.23* |" in reports["table3"].splitlines()


def test_table6_counts_what_the_adaptations_built_beside_the_paper(outputs):
    from xdbert.reports.parameters import table6

    paper = table6(AggregateSettings.from_params(two_families("paper")), outputs[1])
    lines = paper.splitlines()
    assert "| BERT-b | 109,482,240 | 109,482,240 | - | - | 109,482,240 | +0 |" in lines
    assert "| XBERT-b | 202,059,009 | 109,482,240 | 63,428,097 | 29,148,672 | 202,059,009 | +0 |" in lines
    # HF's ELECTRA has no pooler: counted as it is, and the difference explained
    assert "| ELECTRA-b | 108,891,648 | 108,891,648 | - | - | 109,482,240 | -590,592 |" in lines
    assert "| XELECTRA-b | 201,468,417 | 108,891,648 | 63,428,097 | 29,148,672 | 202,059,009 | -590,592 |" in lines
    assert "`ElectraModel` has no pooler" in paper and "- seeds:" not in paper
    assert "they add 1,000 to XBERT-b, 1,000 to XELECTRA-b" in paper

    embedded = table6(AggregateSettings.from_params(two_families()), outputs[1])
    assert "| BERT-b | 109,482,240 | 109,482,240 | - | - |" in embedded.splitlines()
    assert "paper (Table 6)" not in embedded and "no pooler" not in embedded

    metrics = outputs[1] / "electra" / "xdbert.json"
    io.write_json(metrics, {k: v for k, v in io.read_json(metrics).items() if k != "parameters"})
    with pytest.raises(PipelineError, match=r"electra/xdbert.json has no `parameters`: rerun `dvc repro adapt@electra`"):
        table6(AggregateSettings.from_params(two_families()), outputs[1])


def test_labels_that_make_the_same_row_twice_are_refused():
    p = two_families()
    p["families"]["electra"]["label"] = "DBERT-b"  # its full model's row, XDBERT-b, is bert's adapted encoder's
    with pytest.raises(PipelineError, match="rows XDBERT-b more than once"):
        AggregateSettings.from_params(p)


def test_a_study_without_the_baseline_is_refused_before_any_table():
    """The finetune stage runs without it; every Δ row of the tables is against it, so aggregate says so first."""
    p = two_families()
    p["finetune"]["models"] = ["xdbert"]
    with pytest.raises(PipelineError, match=r"^`finetune.models` must list baseline: every Δ row of Tables 1, 3 and 8 is "
                                            r"against its family's baseline; got \['xdbert'\]$"):
        AggregateSettings.from_params(p)


def test_a_delta_has_its_cells_digits():
    """READ's RMSE is printed with 3 digits in its cells, and so is its Δ: at 2 an interval that excludes 0
    could print as ending at -0.00."""
    from xdbert.reports.tables import delta_text

    d = {"delta": -0.0362, "ci_low": -0.0703, "ci_high": -0.0046, "significant": True}
    assert delta_text(get_task("read"), d) == "-0.036* <sub>[-0.070, -0.005]</sub>"
    assert delta_text(RTE, {**d, "significant": False}) == "-3.62 <sub>[-7.03, -0.46]</sub>"
