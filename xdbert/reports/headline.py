"""metrics/headline.json: the few numbers `xdbert compare` (`dvc exp show`) puts side by side.

    t1_gain  Table 1: the adapted encoders (XD<label>) against their own family's baseline
    t3_gain  Table 3: the ablations and controls of `adapt.family` against its baseline
    t8_gain  Table 8: the whole cross-modal models (X<label>, the rows Table 1 lacks) against their baseline
    gates    the mechanism study's gates that pass, as "ABC pass" (with the study on)
    ladder   its ladder's rungs that pass, as "MR pass" (where results/mechanism.json has a ladder)

A gain is the mean, over a table's Δ rows and every task of each, of the Δ the table prints (the difference of
the medians over seeds), in points: 100 x the task's metric, a lower-is-better metric (READ's RMSE) sign-flipped,
so a positive gain is better everywhere. One column per table, not per row: an experiment that changes the
adaptations changes every row (ten in the embedded profile, more in the paper's), more columns than a
120-column terminal holds beside the experiment's name and the param it changed. Every cell stays in
metrics/tables.json, which `dvc metrics diff HEAD <experiment> --targets metrics/tables.json` reads; it and the
other metrics files are columns of `dvc exp show` too, over a thousand, which `xdbert compare` drops
(`exp_show_drop`).
"""
from __future__ import annotations

from xdbert import paths
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError

# The mechanism stage's state of a gate or rung that holds (xdbert.analysis.mechanism_stats.PASS); not imported, so
# that an edit of the study's statistics does not rerun this stage.
PASS = "PASS"

# The columns `headline` writes, as `dvc exp show` names them: the only metrics `xdbert compare` keeps.
KEYS = ("t1_gain", "t3_gain", "t8_gain", "gates", "ladder")


def gain(rows: dict[str, dict[str, dict]]) -> float | None:
    """The mean Δ in points (+ is better) of the cells of `rows` ({row: {task: cell}} as `tables.render` gives
    them) that have one (`vs_baseline`); None where none has."""
    points = [100 * cell["vs_baseline"]["delta"] * (1 if get_task(task).higher_is_better else -1)
              for cells in rows.values() for task, cell in cells.items() if "vs_baseline" in cell]
    return round(sum(points) / len(points), 2) + 0.0 if points else None  # + 0.0: no -0.0 in the file


def passing(entries, what: str) -> str:
    """'ABC pass': the names of `entries` (results/mechanism.json's gates or ladder, name -> {"state": ...}) whose
    state is PASS, in the file's order; 'none pass' where none is."""
    try:
        names = "".join(name for name, entry in entries.items() if entry["state"] == PASS)
    except (KeyError, TypeError, AttributeError):
        raise PipelineError(f"{paths.MECHANISM_METRICS}: its {what} have no `state` each (name -> {{\"state\": ...}}); "
                            "rerun the mechanism stage (`dvc repro mechanism`)") from None
    return f"{names or 'none'} pass"


def headline(results: dict, mechanism: dict | None) -> dict:
    """The headline of `tables.render`'s results ({table: {row: {task: cell}}}) and of results/mechanism.json
    (`mechanism`; None with the study off). A table without Δ rows (Table 8 without `finetune.full_models`) has
    no gain."""
    t1 = results["table1"]
    gains = {"t1_gain": gain(t1), "t3_gain": gain(results["table3"]),
             "t8_gain": gain({row: cells for row, cells in results["table8"].items() if row not in t1})}
    out = {key: value for key, value in gains.items() if value is not None}
    if mechanism is not None:
        out["gates"] = passing(mechanism.get("gates"), "gates")
        if "ladder" in mechanism:
            out["ladder"] = passing(mechanism["ladder"], "ladder rungs")
    return out


def exp_show_drop(sections) -> str:
    """The `--drop` pattern of `dvc exp show` that `xdbert compare` passes: it drops every column (matched from its
    start) but the experiment's name, the headline's KEYS and the params of `sections` (params.yaml's, each column
    `<section>.<key>`). results/grounding.json's columns `tasks.<task>.<...>` start like the `tasks` section's, so of
    `tasks.` only one-word keys and `tasks.train_sizes.<task>` are spared; and a headline key is spared by its whole
    name, so results/mechanism.json's `gates.<gate>...` and `ladder.<rung>...` are dropped."""
    params = "|".join(sorted(set(sections) - {"tasks"}))
    return rf"(?!Experiment$|({'|'.join(KEYS)})$|tasks\.(\w+$|train_)|({params})\.)"
