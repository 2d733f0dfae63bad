"""The finetune stage and its results files: metrics and predictions written, bad input refused before
any work."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from keyword_tasks import keyword_tables, settings
from xdbert import paths
from xdbert.data.tasks.registry import get_task, write_tasks
from xdbert.errors import PipelineError
from xdbert.finetuning.control import engine, grid
from xdbert.finetuning.control.prepare import prepare
from xdbert.finetuning.control.results import write_results
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")


def test_results_have_medians_and_one_row_per_seed_split_example(bert_dir, tmp_path):
    spec = get_task("mnli")
    job = prepare("encoder", bert_dir, keyword_tables("mnli", 48, 20), settings(spec, epochs=1))
    runs = grid.run_seeds(job, [0, 1, 2])
    metrics = write_results(tmp_path / "out", job, runs, {"run": "tiny"})
    preds = pq.read_table(tmp_path / "out" / "predictions.parquet").to_pandas()
    assert len(preds) == 3 * 2 * 20 and set(preds["split"]) == {"dev_matched", "dev_mismatched"}
    assert list(preds.columns) == ["seed", "split", "idx", "prediction", "label", "correct"]
    assert (preds["correct"] == (preds["prediction"] == preds["label"])).all()
    accs = [r["metrics"]["dev_mismatched"]["accuracy"] for r in runs]
    assert metrics["median"]["dev_mismatched"]["accuracy"] == float(np.median(accs))
    assert metrics["headline"] == metrics["median"]["dev_matched"]["accuracy"]
    assert set(metrics["seeds"]) == {"0", "1", "2"} and metrics["hyperparameters"]["epochs"] == 1
    # a run with a wrong number of predictions is refused and nothing is written
    runs[1]["predictions"]["dev_matched"] = runs[1]["predictions"]["dev_matched"][:-1]
    with pytest.raises(PipelineError, match="19 predictions for 20 examples"):
        write_results(tmp_path / "bad", job, runs, {})
    assert not (tmp_path / "bad").exists()


ROOT = Path(__file__).resolve().parents[1]


FINETUNE_PARAMS = {
    "lr": {t: {"base": 3e-3, "large": 3e-3} for t in ("rte", "mrpc", "sst2", "stsb")},
    "epochs": 2, "warmup_ratio": 0.1, "batch_size": 16, "eval_batch_size": 64, "max_len": 32, "weight_decay": 0.01,
    "length_group": 4, "clip_blocks_per_sentence": 2, "dropout": 0.1,
    "seeds": [0, 1], "rte_seeds": [0, 1, 2], "precision": "auto",
    "compile": False, "cuda_graph": False, "stack": 1, "models": ["xdbert"], "ablations": [], "ablation_tasks": [], "ablation_lr": None, "ablation_seeds": None,
    "full_models": [], "clip_tasks": [],
}


@pytest.fixture()
def workdir(tmp_path, bert_dir):
    """A repository-shaped folder: params.yaml, data/tasks (sst2 and stsb), models/adapted/tiny/xdbert (family tiny)."""
    (tmp_path / "models" / "adapted" / "tiny").mkdir(parents=True)
    os.symlink(bert_dir, tmp_path / "models" / "adapted" / "tiny" / "xdbert")
    write_tasks({"sst2": keyword_tables("sst2", 48, 16), "stsb": keyword_tables("stsb", 32, 12)},
                tmp_path / "data" / "tasks", "test")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "profile": "embedded", "tasks": {"names": ["sst2", "stsb"]}, "adapt": {"family": "tiny", "variants": {}},
        "families": {"tiny": {"label": "Tiny", "size": "base", "layer_lr_decay": 1.0}}, "finetune": FINETUNE_PARAMS,
        "mechanism": {**values("embedded")["mechanism"], "enabled": False}}))
    return tmp_path


def run_stage_here(cwd: Path, args: tuple, monkeypatch, capsys, workers: int = 2) -> tuple[int, str, str]:
    """The stage script in this process (its imports are already paid), with at most `workers` Ray workers:
    (exit code, stdout, stderr)."""
    import runpy

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["stages/finetune.py", *args])
    monkeypatch.setenv("XDBERT_FINETUNE_WORKERS", str(workers))
    code = 0
    try:
        runpy.run_path(str(ROOT / "stages" / "finetune.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def outputs(workdir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(workdir)): p.read_bytes() for p in (workdir / "results" / "finetune").rglob("*") if p.is_file()}


@pytest.mark.slow
def test_stage_writes_metrics_and_predictions(workdir, local_ray, monkeypatch, capsys):
    """Every task's runs in one grid of 2 Ray workers, its plan first and each task's medians as its last run
    ends; then the same stage with 1 worker and an empty run cache writes the same bytes, and again with
    the cache trains nothing. The run cache is in DVC's cache."""
    import subprocess

    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=workdir, check=True)
    monkeypatch.delenv(paths.RUN_CACHE_ENV, raising=False)
    cache = (workdir / ".dvc" / "cache" / paths.RUN_CACHE_NAME).resolve()
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys, workers=2)
    assert code == 0, err
    lines = [line for line in log.splitlines() if line.startswith("finetune")]
    assert lines[:3] == ["finetune sst2: tokenized for 1 model", "finetune stsb: tokenized for 1 model",
                         "finetune: plan: 4 runs, 0 reused, 4 to train on 2 workers (an estimate once the first runs end)"]
    said = {line.split(":")[0]: i for i, line in enumerate(lines)}  # where each task's median, and its summary, is
    for task in ("sst2", "stsb"):  # a task's medians come as its last run ends, after a progress line
        assert 3 < said[f"finetune {task} tiny/xdbert"] < said[f"finetune {task}"], lines
    [done] = [i for i, line in enumerate(lines) if line.endswith(" elapsed, done")]  # as the last run ends
    assert lines[done].startswith("finetune: 100% of est. time, 4/4 runs, ")
    assert done > max(said[f"finetune {task} tiny/xdbert"] for task in ("sst2", "stsb"))
    for task, n_dev in (("sst2", 16), ("stsb", 12)):
        out = workdir / "results" / "finetune" / task / "tiny" / "xdbert"
        metrics = yaml.safe_load((out / "metrics.json").read_text())
        assert (metrics["run"], metrics["family"], metrics["kind"], metrics["n_seeds"]) == ("tiny/xdbert", "tiny", "encoder", 2)
        assert metrics["task"] == task and metrics["metric"] == get_task(task).metric
        assert metrics["hyperparameters"]["lr"] == 3e-3 and metrics["hyperparameters"]["model_size"] == "base"
        preds = pq.read_table(out / "predictions.parquet")
        assert preds.num_rows == 2 * n_dev and sorted(set(preds.column("seed").to_pylist())) == [0, 1]
        assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "predictions.parquet"]
        assert f"finetune {task}: 0 of 2 runs reused from {cache}, 2 trained" in log
    assert "finetune stsb tiny/xdbert: median spearman" in log
    assert len(list(cache.glob("*.pt"))) == 4  # every finished run is kept by what decided it
    two = outputs(workdir)
    shutil.rmtree(cache)
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys, workers=1)
    assert code == 0 and "finetune sst2: 0 of 2 runs reused" in log, err
    assert outputs(workdir) == two  # the worker count is in no output byte
    code, log, err = run_stage_here(workdir, (), monkeypatch, capsys)
    assert code == 0 and f"finetune stsb: 2 of 2 runs reused from {cache}, 0 trained" in log, err
    assert "\nfinetune: plan: 4 runs, 4 reused, 0 to train\nfinetune sst2 tiny/xdbert: median accuracy" in log
    assert outputs(workdir) == two

def test_the_run_cache_is_where_a_variable_names_or_in_checkpoints_outside_dvc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no DVC repository here (`test_stage_writes_metrics_and_predictions`: one)
    monkeypatch.delenv(paths.RUN_CACHE_ENV, raising=False)
    assert paths.run_cache() == Path("checkpoints/runs")
    monkeypatch.setenv(paths.RUN_CACHE_ENV, str(tmp_path / "shared"))
    assert paths.run_cache() == tmp_path / "shared"


def test_a_bad_machine_setting_fails_before_any_work(workdir, monkeypatch, capsys):
    """A `RAY_ADDRESS` where nothing answers (ray.init would retry it for ever), or a runs-per-GPU count a
    CPU machine never reads: the stage says so in one line, in seconds, and the results already written
    stay."""
    import socket

    kept = workdir / "results" / "finetune" / "sst2" / "kept.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("yesterday's")
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for variable, value, says in (
            ("RAY_ADDRESS", f"127.0.0.1:{port}", f"nothing answers at 127.0.0.1:{port}"),
            ("RAY_ADDRESS", "headnode", "'headnode' is not a Ray address; allowed: HOST:PORT"),
            (engine.RUNS_PER_GPU_ENV, "four", "XDBERT_RUNS_PER_GPU='four' must be a positive number, or auto")):
        monkeypatch.setenv(variable, value)
        code, log, err = run_stage_here(workdir, (), monkeypatch, capsys)
        monkeypatch.delenv(variable)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert "finetune sst2" not in log and kept.read_text() == "yesterday's"


@pytest.mark.parametrize("args, change, message", [
    ((), {"names": ["boolq"]}, "unknown entry of `tasks.names` 'boolq'; allowed: rte, mrpc"),
    ((), {"models": ["missing"]}, "`finetune.models` names 'missing'; every family adapts only baseline, xdbert"),
    ((), {"models": ["baseline"]}, "model folder models/adapted/tiny/baseline is missing"),
    ((), {"adapt": {"family": "bert", "variants": {}}}, "`adapt.family` names 'bert', which is not a family; allowed: tiny"),
    ((), {"seeds": []}, "`finetune.seeds` must be a non-empty list"),
    ((), {"families": {"tiny": {"label": "Tiny", "size": "base", "layer_lr_decay": 0}}},
     "`families.tiny.layer_lr_decay` must be in (0, 1]"),
    ((), {"families": {"tiny": {"label": "Tiny", "size": "xl", "layer_lr_decay": 1.0}}},
     "unknown families.tiny.size 'xl'; allowed: base, large"),
    ((), {"compile": "yes"}, "`finetune.compile` must be true, false or auto (on a GPU only); got 'yes'"),
    ((), {"names": ["sst2", "mrpc"]}, "task mrpc lacks split file(s)"),
    ((), {"names": ["rte"], "rte_seeds": []}, "`finetune.rte_seeds` must be a non-empty list"),
    ((), {"lr": {"sst2": {"base": 1e-3}}}, "`finetune.lr.sst2.large` must be a positive number"),
    ((), {"lr": {"rte": {"base": 1e-3, "large": 1e-3}}}, "`finetune.lr.sst2` must map base, large"),
    ((), {"lr": {"sst2": 1e-3}}, "`finetune.lr.sst2` must map base, large (and optionally full"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3, "full": 0}}}, "`finetune.lr.sst2.full` must be a positive number"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3, "xl": 1e-3}}}, "`finetune.lr.sst2` has unknown keys ['xl']; allowed: base, large, full"),
    ((), {"full_models": ["xdbert"]}, "model folder models/crossmodal/tiny/xdbert is missing"),
    # every task's rates are checked, and the table names tasks only
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3}, "rte": {"base": "fast", "large": 1e-3}}},
     "`finetune.lr.rte.base` must be a positive number; got 'fast'"),
    ((), {"lr": {"sst2": {"base": 1e-3, "large": 1e-3}, "rtee": {"base": 1e-3, "large": 1e-3}}},
     "unknown entry of `finetune.lr` 'rtee'; allowed: rte, mrpc"),
    ((), {"ablation_tasks": ["boolq"]}, "unknown entry of `finetune.ablation_tasks` 'boolq'"),
    ((), {"ablation_tasks": ["rte"]}, "unknown entry of `finetune.ablation_tasks` 'rte'; allowed: sst2, stsb"),  # not in tasks.names
    ((), {"ablation_lr": 0}, "`finetune.ablation_lr` must be a positive number"),
    ((), {"ablation_seeds": [1, 1]}, "`finetune.ablation_seeds` must list distinct integers"),
    (("sst2",), None, "usage: python stages/finetune.py (no arguments: it reads params.yaml); got 'sst2'"),
])
def test_stage_rejects_bad_input_before_any_work(workdir, args, change, message, monkeypatch, capsys):
    if change:
        p = yaml.safe_load((workdir / "params.yaml").read_text())
        p["finetune"].update({k: v for k, v in change.items() if k not in ("names", "adapt", "families")})
        p.update({k: v for k, v in change.items() if k in ("adapt", "families")})
        p["tasks"]["names"] = change.get("names", p["tasks"]["names"])
        (workdir / "params.yaml").write_text(yaml.safe_dump(p))
    code, _, err = run_stage_here(workdir, args, monkeypatch, capsys)
    assert code == 2, err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1
    assert not (workdir / "results").exists()


def test_stage_fails_on_a_missing_split_file(workdir, monkeypatch, capsys):
    (workdir / "data" / "tasks" / "sst2" / "dev.parquet").unlink()
    code, _, err = run_stage_here(workdir, (), monkeypatch, capsys)
    assert code == 2 and "data/tasks/sst2/dev.parquet" in err and "it needs train, dev" in err
    assert not (workdir / "results").exists()
