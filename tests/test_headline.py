"""metrics/headline.json: each table's mean Δ and the mechanism's passing gates, the metric whose columns
`xdbert compare` (`dvc exp show`) keeps, so that it fits a 120-column terminal (rendered here by DVC's own table
code)."""
from __future__ import annotations

import io as stdio
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from xdbert.cli import app
from xdbert.errors import PipelineError
from xdbert.params import SECTIONS
from xdbert.profiles import values
from xdbert.paths import HEADLINE
from xdbert.reports.headline import KEYS, exp_show_drop, headline

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import dvc_yaml as D  # noqa: E402


def cell(median: float, delta: float | None = None) -> dict:
    """A cell of `tables.render`'s results, with the Δ of a Δ row."""
    return {"median": median, **({"vs_baseline": {"delta": delta}} if delta is not None else {})}


def mechanism(gates: dict[str, str], ladder: dict[str, str] | None = None) -> dict:
    """results/mechanism.json as the mechanism stage writes it: name -> {"state": ...}, the ladder where it has one."""
    out = {"gates": {name: {"name": name, "state": state} for name, state in gates.items()}}
    return out | ({"ladder": {name: {"state": state} for name, state in ladder.items()}} if ladder else {})


def test_a_tables_gain_is_the_mean_of_its_delta_cells_in_points_better_upward():
    results = {
        "table1": {"CLIP-T": {"rte": cell(0.40)}, "BERT-b": {"rte": cell(0.50), "read": cell(0.70)},
                   # READ is an RMSE: 0.66 against 0.70 is 4 points better
                   "XDBERT-b": {"rte": cell(0.60, 0.10), "read": cell(0.66, -0.04)},
                   "ELECTRA-b": {"rte": cell(0.70)}, "XDELECTRA-b": {"rte": cell(0.68, -0.02)}},
        "table3": {"baseline": {"rte": cell(0.50)}, "xdbert": {"rte": cell(0.60, 0.10)},
                   "mlm": {"rte": cell(0.45, -0.05)}},
        # Table 8 repeats Table 1's XD rows: its gain is the whole models' (X<label>) alone
        "table8": {"BERT-b": {"rte": cell(0.50)}, "XDBERT-b": {"rte": cell(0.60, 0.10)},
                   "XBERT-b": {"rte": cell(0.53, 0.03)}},
    }
    assert headline(results, None) == {"t1_gain": 4.0, "t3_gain": 2.5, "t8_gain": 3.0}  # (10 + 4 - 2) / 3
    results["table8"].pop("XBERT-b")  # no `finetune.full_models`: Table 8 has no gain of its own
    assert headline(results, None) == {"t1_gain": 4.0, "t3_gain": 2.5}


def test_the_gates_and_the_ladder_that_pass_in_order():
    results = {"table1": {}, "table3": {}, "table8": {}}
    gates = {"A": "PASS", "B": "PASS", "C": "FAIL", "D": "not replicated", "E": "PASS"}
    assert headline(results, mechanism(gates)) == {"gates": "ABE pass"}  # no ladder in the file: no column
    assert headline(results, mechanism(gates, {"M": "PASS", "R": "FAIL", "T": "uninformative"})) == \
        {"gates": "ABE pass", "ladder": "M pass"}
    assert headline(results, mechanism(dict.fromkeys("ABCDE", "FAIL")))["gates"] == "none pass"
    with pytest.raises(PipelineError, match=r"results/mechanism.json: its gates have no `state`.*dvc repro mechanism"):
        headline(results, {"gates": {"A": {"passed": True}}})
    with pytest.raises(PipelineError, match=r"results/mechanism.json: its ladder rungs have no `state`"):
        headline(results, {"gates": {}, "ladder": ["M"]})


def declared_metrics(stages: dict) -> dict[str, list[str]]:
    """Each stage's metrics files, as dvc.yaml names them (`${key}` and all)."""
    bodies = {name: stage.get("do", stage) for name, stage in stages.items()}
    return {name: [next(iter(m)) for m in body["metrics"]] for name, body in bodies.items() if "metrics" in body}


def test_the_headline_is_a_metric_and_every_result_kept_in_git_is_one():
    """DVC saves no run cache for a stage with an uncached out that is not a metric (`Stage.run`), so every JSON
    result stays a metric, `cache: false`; `xdbert compare` picks the headline's columns out of them."""
    for stages in (yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"],
                   yaml.safe_load(D.render())["stages"]):
        assert declared_metrics(stages)["aggregate"] == ["metrics/tables.json", str(HEADLINE)]
        bodies = [stage.get("do", stage) for stage in stages.values()]
        assert all(o[path] == {"cache": False} for body in bodies for o in body.get("metrics", []) for path in o)
        assert not [o for body in bodies for o in body.get("outs", []) if isinstance(o, dict)]


# ----------------------------------------------------------------------------------------------------
# `xdbert compare`: its `dvc exp show`, rendered by DVC at 120 columns
# ----------------------------------------------------------------------------------------------------

def compare(monkeypatch, *args: str, returncode: int = 0):
    """`xdbert compare ARGS`'s result and the command it ran, which exits with `returncode`."""
    ran = []

    def run(command, **kwargs):
        ran.append((command, kwargs))
        return subprocess.CompletedProcess(command, returncode)

    monkeypatch.setattr(subprocess, "run", run)
    result = CliRunner().invoke(app, ["compare", *args])
    assert len(ran) == 1 and ran[0][1] == {}, ran  # one run, no shell
    return result, ran[0][0]


def compare_command(monkeypatch) -> list[str]:
    """The `dvc exp show` that `xdbert compare` runs, as the arguments after `dvc`."""
    return compare(monkeypatch)[1][1:]


@pytest.mark.parametrize("args", [[], ["--md"], ["-n", "5", "--csv"], ["--sort-by", "t1_gain", "--drop", "x"]])
def test_compare_runs_dvc_exp_show_with_the_pattern_and_its_arguments(monkeypatch, args):
    result, command = compare(monkeypatch, *args, returncode=3)
    assert command == ["dvc", "exp", "show", "--only-changed", "--drop", exp_show_drop(SECTIONS), *args]
    assert result.exit_code == 3  # dvc's own: a script sees its failure
    assert compare(monkeypatch, *args)[0].exit_code == 0


def test_compare_without_dvc_says_so_in_one_line(monkeypatch):
    def missing(command, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", command[0])

    monkeypatch.setattr(subprocess, "run", missing)
    result = CliRunner().invoke(app, ["compare"])
    assert result.exit_code == 2, result
    assert result.output.startswith("error: `dvc` is not on PATH") and result.output.count("\n") == 1, result.output


def flat(tree: dict, prefix: str = "") -> dict:
    """Every leaf of `tree` by its dotted key, as `dvc exp show` names the params."""
    out = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value}
    return out


def with_key(params: dict, key: str, value) -> dict:
    """`params` with `key` (dotted) set to `value`, as `dvc exp run -S key=value` sets it."""
    out = yaml.safe_load(yaml.safe_dump(params))
    *parents, last = key.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def committed_results() -> dict[str, dict]:
    """Every metrics file of dvc.yaml but the headline, as committed: their keys are `dvc exp show`'s columns too,
    named `<file>:<key>` where two files share a key."""
    paths = [path for paths in declared_metrics(yaml.safe_load(D.render())["stages"]).values() for path in paths]
    found = {path: sorted(ROOT.glob(re.sub(r"\$\{[^}]+\}", "*", path))) for path in paths if path != str(HEADLINE)}
    assert all(found.values()), found  # each of them has a committed example
    return {str(f.relative_to(ROOT)): json.loads(f.read_text(encoding="utf-8")) for fs in found.values() for f in fs}


def moved(tree):
    """`tree` with every number changed, as an experiment that retrains the models changes them."""
    if isinstance(tree, dict):
        return {key: moved(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [moved(value) for value in tree]
    return tree + 1 if isinstance(tree, (int, float)) and not isinstance(tree, bool) else tree


def exp_show(monkeypatch, key: str, before: dict, after: dict) -> list[str]:
    """The lines `xdbert compare`'s `dvc exp show` prints at 120 columns after one experiment that set `key` of the
    embedded profile's params (1 before it), whose headline went from `before` to `after` and which changed every
    number of every other metrics file; the workspace holds the experiment, as after `dvc exp run`. Each row's
    deps include an adaptation whose hash the experiment changed."""
    from dvc.cli import parse_args
    from dvc.commands.experiments.show import show_experiments
    from dvc.commands.metrics import DEFAULT_PRECISION
    from dvc.repo.experiments.serialize import ExpDep, ExpRange, ExpState, SerializableExp
    from dvc.repo.experiments.show import tabulate
    from dvc.ui import ui
    from rich.console import Console

    args = parse_args(compare_command(monkeypatch))
    params = values("embedded")
    results = committed_results()

    def state(rev: str, name: str | None, params: dict, metrics: dict, others: dict, adapted: str,
              when: datetime | None):
        deps = {"stages/aggregate.py": ExpDep("a" * 32, 1, None), "models/adapted": ExpDep(adapted + ".dir", 9, 3),
                "hub.lock.json": ExpDep("b" * 32, 1, None)}
        written = dict(sorted(metrics.items()))  # as xdbert.io.write_json writes it: the columns' order
        files = {path: {"data": data} for path, data in (others | {str(HEADLINE): written}).items()}
        return ExpState(rev, name, SerializableExp(rev, when, {"params.yaml": {"data": params}}, files, deps))

    retrained = moved(results)
    experiment = state("1" * 40, "dusty-aces", with_key(params, key, 2), after, retrained, "c" * 32,
                       datetime(2026, 1, 6, 9, 30))
    states = [state("workspace", None, with_key(params, key, 2), after, retrained, "c" * 32, None),
              state("0" * 40, "main", with_key(params, key, 1), before, results, "d" * 32, datetime(2026, 1, 5, 18, 0))]
    states[1].experiments = [ExpRange([experiment], name="dusty-aces")]

    out = stdio.StringIO()
    monkeypatch.setattr(ui, "_enabled", True)
    monkeypatch.setitem(ui.__dict__, "rich_console", Console(file=out, width=120, color_system=None))
    td, headers = tabulate(states, precision=DEFAULT_PRECISION, fill_value="-")
    show_experiments(td, headers, keep=args.keep, drop=args.drop, pager=False, only_changed=args.only_changed)
    return out.getvalue().splitlines()


def widest(delta: float, passed: str) -> dict:
    """A headline as wide as it gets: gains of six characters (-12.34), the gates and rungs of `passed` passing."""
    t = {"table1": {"XDBERT-b": {"rte": cell(0.6, delta)}}, "table3": {"mlm": {"rte": cell(0.6, delta)}},
         "table8": {"XBERT-b": {"rte": cell(0.6, delta)}}}
    return headline(t, mechanism({g: "PASS" if g in passed else "FAIL" for g in "ABCDE"},
                                 {r: "PASS" if r in passed else "FAIL" for r in "MRT"}))


BEFORE = widest(-0.1234, "ABCDE")
AFTER = widest(-0.4321, "MRT")


def test_the_widest_headline_is_as_assumed():
    assert BEFORE == {"t1_gain": -12.34, "t3_gain": -12.34, "t8_gain": -12.34, "gates": "ABCDE pass",
                      "ladder": "none pass"}
    assert set(AFTER) == set(BEFORE) and all(AFTER[k] != BEFORE[k] for k in AFTER)
    assert tuple(BEFORE) == KEYS  # the columns `xdbert compare` keeps are all the headline writes


@pytest.mark.parametrize("key, before, after", [
    ("adapt.epochs", BEFORE, AFTER),  # the README's experiment, every headline column changed
    ("adapt." + "x" * 28, BEFORE, AFTER),  # as long a key as fits beside every column: 34 characters
    # the README's sweep, one variant: Table 3's gain moves (and the gates and ladder, at worst)
    ("adapt.variants.one_cross.cross_layers", BEFORE, BEFORE | {k: AFTER[k] for k in ("t3_gain", "gates", "ladder")}),
    # the longest key of the embedded profile, Table 3's gain alone
    (max(flat(values("embedded")), key=len), BEFORE, BEFORE | {"t3_gain": AFTER["t3_gain"]}),
])
def test_compare_after_one_key_fits_120_columns_every_column_readable(monkeypatch, key, before, after):
    lines = exp_show(monkeypatch, key, before, after)
    text = "\n".join(lines)
    assert max(map(len, lines)) <= 120 and "…" not in text, text  # DVC collapses what does not fit into "…"
    header = lines[1].split()
    changed = sorted(k for k in after if after[k] != before[k])
    assert header == ["Experiment", *changed, key], text  # nor the deps' hashes, nor an unchanged param
    workspace, main, experiment = lines[3:6]
    assert str(after["t3_gain"]) in experiment and str(before["t3_gain"]) in main and "dusty-aces" in experiment


def test_compare_drops_no_params_column(monkeypatch):
    """Its `--drop` spares a param's column by the params section it starts with: any key of either profile, and
    those of a section added to params.SECTIONS without another edit."""
    from dvc.cli import parse_args

    drop = re.compile("|".join(parse_args(compare_command(monkeypatch)).drop))  # as `dvc exp show` joins them
    keys = {key for profile in ("embedded", "paper") for key in flat(values(profile))} - {"profile"}
    assert [key for key in sorted(keys) if drop.match(key)] == []  # `profile` is switched by `xdbert profile`
    assert re.match(exp_show_drop(SECTIONS), "newsection.epochs")
    assert not re.match(exp_show_drop((*SECTIONS, "newsection")), "newsection.epochs")
