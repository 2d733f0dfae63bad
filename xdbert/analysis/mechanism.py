"""The mechanism study's report (issue 55, ../shared/MECHANISM.md "Rows" and "Gates"), from loaded data.

The stage `mechanism` loads the models and predictions; this module turns them into numbers:

- `probe_row`: the representation probe of one model at every layer (probe.py), and `probe_at`, the layer
  the cross layers read (`gates.probe_layer` = `cross_input`: an encoder's last hidden state, a CLIP tower's
  output after ln_final; both the last layer `representations` returns).
- `correct_matrix`: a run's dev predictions as (seeds, examples) bool in dev-example order; `cells`: a row's
  F+, F0, T=, T!= and control cells with intervals (mechanism_stats.cell).
- `bag_of_words`: the bag-of-words row on F+, pooled over facts seeds, with a one-sided binomial p against
  chance (1 / attributes).
- `gate_e_counts`: improved and worsened F examples of XDBERT against `nofacts`, as grounding.compare_models
  counts them, split by kind.
- `claim_json` / `claim_from_json`: gate D's Claim in results/mechanism.json, read back for the replication.
- `report_markdown`: reports/mechanism.md.

No paths or params: the stage passes every value. Bad data raises ValueError.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from xdbert.analysis import mechanism_stats as S
from xdbert.analysis import probe

KINDS = ("F+", "F0", "T=", "T!=")
CONTROL = "control"
COLUMNS = (*KINDS, CONTROL)


# ----------------------------------------------------------------------------------------------------
# The representation probe
# ----------------------------------------------------------------------------------------------------

def probe_row(features: Sequence[np.ndarray], classes: np.ndarray, null_classes: np.ndarray, n_classes: int,
              lam: float) -> list[dict]:
    """Per layer (features[i]: (objects, width)): left-out accuracy; its p, the null's mean and 95th percentile
    against the fact table re-drawn (`null_classes` (draws, objects): probe.redrawn_classes); `selectivity`, the
    accuracy minus that mean (what the probe reads beyond the strata the tables keep balanced); and each
    object's 0/1 (the paired sign-flip test reads them)."""
    rows = []
    for layer, x in enumerate(features):
        correct = probe.loo_correct(x, classes, n_classes, lam)
        null = probe.null_accuracies(x, null_classes, n_classes, lam)
        accuracy, null_mean = float(correct.mean()), float(null.mean())
        rows.append({"layer": layer, "accuracy": accuracy, "p": probe.p_above(accuracy, null), "null_mean": null_mean,
                     "null_q95": float(np.quantile(null, 0.95)), "selectivity": accuracy - null_mean,
                     "correct": correct.astype(int).tolist()})
    return rows


def probe_at(rows: list[dict], layer: str) -> dict:
    """The probe at `gates.probe_layer`; `cross_input` (the only one allowed) is the last layer of a row."""
    if layer != "cross_input":
        raise ValueError(f"unknown probe layer {layer!r}; the study reads `cross_input`")
    return rows[-1]


# ----------------------------------------------------------------------------------------------------
# Cells from predictions
# ----------------------------------------------------------------------------------------------------

def correct_matrix(preds: pd.DataFrame, split: str, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(dev example idx (examples,), correct (seeds, examples) bool) of one split of a run's predictions
    (as `finetuning.control.predictions.read_predictions` checked them), in `idx`'s order where given, else
    sorted by idx."""
    rows = preds[preds["split"] == split]
    if rows.empty:
        raise ValueError(f"{preds.attrs.get('source', 'the predictions')} has no rows of split {split!r}")
    table = rows.pivot(index="seed", columns="idx", values="correct").sort_index()
    if idx is not None:
        missing = sorted(set(idx.tolist()) - set(table.columns.tolist()))
        if missing:
            raise ValueError(f"{preds.attrs.get('source', 'the predictions')} lacks dev examples {missing[:5]}")
        table = table[list(idx)]
    return table.columns.to_numpy(), table.to_numpy().astype(bool)


def cells(vis: np.ndarray, objects: np.ndarray, kinds: np.ndarray, control: np.ndarray, gates: Mapping,
          seed: int) -> dict[str, S.Interval]:
    """A row's cells: F+, F0, T=, T!= on `vis` (seeds, examples) by object, and the control task's accuracy
    (seeds, examples), each example its own unit. One bootstrap seed for every row, so rows are paired."""
    kw = dict(n_boot=gates["n_boot"], level=gates["level"], exact_below=gates["exact_below"], seed=seed)
    out = {k: S.cell(vis, objects, kinds, k, **kw) for k in KINDS}
    out[CONTROL] = S.cell(control, None, None, None, **kw)
    return out


def difference(a: np.ndarray, b: np.ndarray, objects: np.ndarray | None, kinds: np.ndarray | None,
               kind: str | None, gates: Mapping, seed: int) -> S.Interval:
    """Row a minus row b on `kind`, paired (mechanism_stats.paired_difference) with the cells' draws."""
    return S.paired_difference(a, b, objects, kinds, kind, n_boot=gates["n_boot"], level=gates["level"],
                               exact_below=gates["exact_below"], seed=seed)


def units(objects: np.ndarray, kinds: np.ndarray, control_examples: int) -> dict[str, str]:
    """Each column's n: objects (examples) on vis, examples on the control task."""
    out = {}
    for k in KINDS:
        keep = kinds == k
        out[k] = f"{len(set(objects[keep].tolist()))} ({int(keep.sum())})"
    out[CONTROL] = str(control_examples)
    return out


def majority(labels: np.ndarray, kinds: np.ndarray | None, n_classes: int) -> dict[str, tuple[float, float]]:
    """(the share of the most common label, chance 1 / n_classes) of each vis kind (`kinds` given) or of
    the whole control split."""
    share = lambda y: float(np.bincount(y).max() / len(y))  # noqa: E731
    if kinds is None:
        return {CONTROL: (share(labels), 1 / n_classes)}
    return {k: (share(labels[kinds == k]), 1 / n_classes) for k in KINDS}


# ----------------------------------------------------------------------------------------------------
# The bag-of-words row, gate E's counts, gate D's claim
# ----------------------------------------------------------------------------------------------------

def bag_of_words(right: int, total: int, n_classes: int) -> tuple[float, float]:
    """(accuracy, one-sided binomial p against chance 1 / n_classes) of `right` of `total` pooled F+ examples.

    Binomial, not a permutation null: the pooled examples are scored by models trained on five
    independent fact tables, and without a leak each prediction is right with chance 1 / n_classes."""
    from scipy.stats import binom

    if total <= 0:
        raise ValueError("the bag-of-words row needs F+ examples")
    return right / total, float(binom.sf(right - 1, total, 1.0 / n_classes))


def gate_e_counts(change: pd.DataFrame, kind_of: Mapping[int, str]) -> tuple[int, int, int, int]:
    """(improved F+, improved F0, worsened F+, worsened F0) from grounding.compare_models' table (idx,
    change) over the F examples; `kind_of`: dev idx -> kind."""
    kinds = change["idx"].map(kind_of)
    if kinds.isna().any() or not kinds.isin(("F+", "F0")).all():
        raise ValueError("gate E reads F examples (F+ and F0) only")
    count = lambda c, k: int(((change["change"] == c) & (kinds == k)).sum())  # noqa: E731
    return count("improved", "F+"), count("improved", "F0"), count("worsened", "F+"), count("worsened", "F0")


def interval_json(i: S.Interval) -> dict:
    return {"estimate": i.estimate, "low": i.low, "high": i.high, "method": i.method}


def claim_json(claim: S.Claim) -> dict:
    return {"f_plus": interval_json(claim.f_plus), "t_equal": interval_json(claim.t_equal),
            "sst2": interval_json(claim.sst2), "flip_p": claim.flip_p}


def claim_from_json(d: Mapping) -> S.Claim:
    """The Claim a results/mechanism.json of this stage recorded (KeyError or TypeError where it has none)."""
    iv = lambda x: S.Interval(float(x["estimate"]), float(x["low"]), float(x["high"]), str(x["method"]))  # noqa: E731
    return S.Claim(iv(d["f_plus"]), iv(d["t_equal"]), iv(d["sst2"]), float(d["flip_p"]))


# ----------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------

def sweep_markdown(sweep: Mapping) -> list[str]:
    """The exploratory sweep's table (bench/mechanism_sweep.py's JSON): a row per variant, and per facts seed
    its pair's F+ difference and the control task's, each with its interval."""
    seeds = sweep["seeds"]

    def shown(i: Mapping) -> str:
        return f"{i['estimate']:+.2f} [{i['low']:.2f}, {i['high']:.2f}]"

    out = ["**Exploratory.** No threshold was fixed for these numbers before they were read, and the facts seeds are "
           "neither the study's (0) nor D's replication (1). Each row: an encoder adapted beside the facts tower minus "
           "the same recipe beside the twin tower, finetuned on vis (F+: the study's interval, objects then seeds) and "
           "on the control task (SST-2: examples then seeds).", "",
           "| ingredient | value | " + " | ".join(f"seed {s}: F+ | seed {s}: SST-2" for s in seeds) + " |",
           "|---|---|" + "---|---|" * len(seeds)]
    for row in sweep["rows"]:
        pairs = [sweep["pairs"][str(s)][row["variant"]] for s in seeds]
        out.append(f"| {row['ingredient']} | {row['value']} | "
                   + " | ".join(f"{shown(p['f_plus'])} | {shown(p['control'])}" for p in pairs) + " |")
    return out


def _cell(i: S.Interval) -> str:
    exact = "*" if i.method == S.EXACT else ""
    return f"{i.estimate:.2f} [{i.low:.2f}, {i.high:.2f}]{exact}"


def records_json(records: Sequence[S.Gate]) -> dict:
    """Rungs or gates for results/mechanism.json: name -> its state, numbers and interval."""
    return {x.name: {"name": x.name, "state": x.state, "passed": x.passed, "numbers": x.numbers,
                     **({"interval": interval_json(x.interval)} if x.interval else {})} for x in records}


def report_markdown(head: str, ladder: Sequence[S.Gate], gates: Sequence[S.Gate], rows: Mapping[str, Mapping[str, S.Interval]],
                    n: Mapping[str, str], chance: Mapping[str, tuple[float, float]], bow: Mapping,
                    probes: Mapping[str, dict], settings: Mapping, control_task: str,
                    notes: Mapping[str, str] | None = None, reference: S.Interval | None = None,
                    exposures: Mapping[str, dict] | None = None, d_power: str = "",
                    readout: tuple[Mapping[str, S.Interval], Mapping[str, S.Interval]] | None = None,
                    sweep: Mapping | None = None) -> str:
    """reports/mechanism.md: header, the calibration ladder, gates, the rows x columns cells, the probe at the cross layers' input,
    the settings, and the plain statement of a null D. `notes`: what a row is, after its name in both tables
    (the caption control: the upper reference); `reference`: the upper reference minus the baseline on F+
    (`mechanism_stats.summary`); `d_power`: a null D read with its power (`power.null_reading`); `readout`: the
    frozen readout's F+ cell per encoder and its paired differences (`frozen_readout`); `sweep`: the exploratory
    sweep's results, where one was run (`sweep_markdown`)."""
    def named(label: str) -> str:
        return f"{label} ({notes[label]})" if notes and label in notes else label

    out = [head, "## Calibration ladder", "", "Read before the gates: D is read only where M and R pass. Each F+ clause "
           "and M's interval carry the smallest gain they detect at 80% power (planted into the model's wrong answers, "
           "through the same interval).", "",
           S.records_table(ladder, "rung")]
    if exposures:
        out += ["Exposures per fact (training targets that state a captioned object's own attribute; XDBERT and the "
                "other adapted encoders read no caption):", "", "| model | target | mean | min | max |", "|---|---|---|---|---|"]
        out += [f"| {name} | {e['target']} | {e['mean']:.0f} | {e['min']:.0f} | {e['max']:.0f} |" for name, e in exposures.items()]
        out += [""]
    out += ["## Gates", "", S.gates_markdown(gates, reference)]
    d = next(g for g in gates if g.name == "D")
    if d.state in (S.FAIL, S.UNINFORMATIVE) and not S.above_zero(d.interval):
        out += [f"**D's F+ clause is null**: {d_power or 'XDBERT does not beat `nofacts` on F+'}.", ""]
    names = {CONTROL: control_task}
    out += ["## Cells", "", "Accuracy, median over seeds, [95% interval: bootstrap over objects then seeds; "
            "* exact sign-flip over objects]. n: objects (examples).", "",
            "| row | " + " | ".join(names.get(c, c) for c in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    out += [f"| {named(label)} | " + " | ".join(_cell(r[c]) if c in r else "" for c in COLUMNS) + " |"
            for label, r in rows.items()]
    out += [f"| bag-of-words (pooled over facts seeds {', '.join(map(str, bow['seeds']))}) | {bow['accuracy']:.2f} "
            f"(binomial p {S.fmt_p(bow['p'])}, {bow['total']} examples) | | | | |",
            "| n | " + " | ".join(n[c] for c in COLUMNS) + " |",
            "| majority class / chance | " + " | ".join(f"{chance[c][0]:.2f} / {chance[c][1]:.2f}" for c in COLUMNS) + " |", ""]
    if readout:
        from xdbert.analysis.frozen_readout import C, POSITION

        cells, diffs = readout
        out += ["## Frozen readout", "", f"No finetuning: a logistic regression (C = {C:g}) on {POSITION}, fitted on the "
                "`vis` train sentences (the train objects), scored on F+: what each encoder holds. Paired differences "
                "below the cells.", "", "| encoder or pair | F+ |", "|---|---|"]
        out += [f"| {named(m)} | {_cell(i)} |" for m, i in cells.items()]
        out += [f"| {pair} | {_cell(i)} |" for pair, i in diffs.items()] + [""]
    out += ["## Representation probe", "", "Leave-one-object-out ridge from the state of the object word at the "
            "layer the cross layers read, over the captioned objects (real facts), against the fact table re-drawn "
            "by `draw_facts` with other seeds (they keep its balance within strata, as a free shuffle does not); "
            "selectivity is accuracy minus the null's mean. Every layer is in results/mechanism.json.", "",
            "| model | accuracy | selectivity | p | null mean | null 95% |", "|---|---|---|---|---|---|"]
    out += [f"| {named(name)} | {r['accuracy']:.2f} | {r['selectivity']:+.2f} | {S.fmt_p(r['p'])} | "
            f"{r['null_mean']:.2f} | {r['null_q95']:.2f} |" for name, r in probes.items()]
    if sweep:
        out += ["", "## Exploratory: which ingredient moves the facts", "", *sweep_markdown(sweep)]
    out += ["", "## Settings", ""] + [f"- {k}: {v}" for k, v in settings.items()] + [""]
    return "\n".join(out)
