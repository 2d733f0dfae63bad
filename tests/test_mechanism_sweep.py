"""bench/mechanism_sweep.py, the mechanism study's exploratory sweep: its pairs, its seeds, its table and plot."""
import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from xdbert.adaptation.settings import AdaptSettings
from xdbert.data.mechanism import MechanismSettings
from xdbert.params import read_yaml_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("mechanism_sweep", ROOT / "bench" / "mechanism_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    spec.loader.exec_module(module)
    return module


def test_each_pair_differs_in_the_tower_alone_and_the_swept_value_is_set(sweep):
    names = list(sweep.variants())
    p = read_yaml_text(sweep.seed_params(2, names))
    assert MechanismSettings.from_params(p).seed == 2
    assert p["mechanism"]["models"] == [n for name in names for n in (name, f"{name}_nofacts")]
    for name in names:
        real, twin = AdaptSettings.from_params(p, name), AdaptSettings.from_params(p, f"{name}_nofacts")
        assert (real.clip_tower, twin.clip_tower) == ("pretrain_clip", "pretrain_clip_nofacts")
        assert dataclasses.replace(real, clip_tower=twin.clip_tower) == twin
    xdbert, match30 = AdaptSettings.from_params(p, "xdbert"), AdaptSettings.from_params(p, "sweep_match30")
    assert AdaptSettings.from_params(p, "sweep_match10") == xdbert  # the sweep's centre is XDBERT's recipe
    assert match30.loss_weights["match"] == 30.0 and AdaptSettings.from_params(p, "sweep_epochs4").epochs == 4
    assert "match" not in AdaptSettings.from_params(p, "sweep_match0").losses
    kl = AdaptSettings.from_params(p, "sweep_kl10")
    assert list(kl.losses) == ["mlm", "kl"] and kl.cross_layers == 0 and kl.loss_weights["kl"] == 10.0


@pytest.mark.parametrize("seeds", ["0", "2,1", "100"])
def test_the_study_s_and_the_tuning_seeds_are_refused_before_any_work(sweep, seeds, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mechanism_sweep.py", "--project", str(tmp_path / "none"), "--work",
                                      str(tmp_path / "work"), "--seeds", seeds])
    with pytest.raises(SystemExit, match="belong to the study"):
        sweep.main()
    assert not (tmp_path / "work").exists()


def test_an_unknown_variant_is_refused_with_the_allowed_ones(sweep, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mechanism_sweep.py", "--project", str(tmp_path), "--only", "sweep_match5"])
    with pytest.raises(SystemExit, match="unknown variants \\['sweep_match5'\\]; allowed: sweep_match0, "):
        sweep.main()


def test_the_pairs_are_read_as_gate_d_reads_xdbert_against_nofacts(sweep):
    """30 objects of F+ and 10 of F0, 4 examples each, 5 seeds: the real side right on every F+ example, the twin
    on none; both the same elsewhere and on the control task."""
    objects = np.repeat(np.arange(40), 4)
    kinds = np.where(objects < 30, "F+", "F0")
    real_vis = np.ones((5, 160), dtype=bool)
    twin_vis = np.where(kinds == "F+", False, True)[None].repeat(5, 0)
    control = np.random.default_rng(0).random((5, 40)) < 0.8
    correct = {"sweep_match1": {"vis": real_vis, "sst2": control}, "sweep_match1_nofacts": {"vis": twin_vis, "sst2": control},
               "_units": {"objects": objects, "kinds": kinds}}
    gates = {"n_boot": 200, "level": 0.95, "exact_below": 20}
    [pair] = sweep.read_pairs(correct, ["sweep_match1"], gates, 2, "sst2").values()
    assert pair["f_plus"]["estimate"] == 1.0 and pair["f_plus"]["low"] > 0
    assert pair["control"]["estimate"] == 0.0


def sweep_result(sweep, pair: dict) -> dict:
    table = sweep.variants()
    return {"seeds": [2, 3], "variants": {n: entry for n, (_, _, entry) in table.items()},
            "rows": [{"variant": n, "ingredient": g, "value": v} for n, (g, v, _) in table.items()],
            "pairs": {s: {n: pair for n in table} for s in ("2", "3")}}


PAIR = {"f_plus": {"estimate": 0.05, "low": -0.02, "high": 0.11}, "control": {"estimate": 0.0, "low": -0.01, "high": 0.01}}


def test_the_table_and_plot_show_every_variant_and_seed(sweep, tmp_path):
    from xdbert.analysis.mechanism import sweep_markdown

    result = sweep_result(sweep, PAIR)
    markdown = "\n".join(sweep_markdown(result))
    assert "**Exploratory.**" in markdown and "| MATCH weight | 10 (XDBERT; 1 epoch) | +0.05 [-0.02, 0.11] |" in markdown
    assert markdown.count("\n| ") == 1 + len(sweep.variants()) and "seed 3: F+" in markdown
    sweep.plot(result, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_the_stage_reads_the_sweep_beside_the_replications_and_refuses_a_file_that_is_none(sweep, tmp_path, monkeypatch):
    from xdbert import io
    from xdbert.analysis import mechanism_study
    from xdbert.errors import PipelineError

    monkeypatch.chdir(tmp_path)
    assert mechanism_study.read_sweep() is None  # not run: the report has no section
    io.write_json(mechanism_study.SWEEP, sweep_result(sweep, PAIR))
    assert mechanism_study.read_sweep()["seeds"] == [2, 3]
    io.write_json(mechanism_study.SWEEP, sweep_result(sweep, {"f_plus": PAIR["f_plus"]}))
    with pytest.raises(PipelineError, match="holds no results of bench/mechanism_sweep.py .*KeyError\\('control'\\)"):
        mechanism_study.read_sweep()
