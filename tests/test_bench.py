"""The benchmarks that bench/gpu_*.sh run on the GPU machine need none of the packages it lacks.

That machine has torch, transformers, accelerate and pyarrow, and the wheels the scripts carry, but not
Ray, DVC or datasets. A benchmark that imported one of them lost a whole lease's results once. Every result
names the commit it measured (bench/provenance.py), there passed in by the lease script.
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("ray", "dvc", "dvclive", "datasets")


def run_without_absent(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where importing any of ABSENT fails, as on the GPU machine."""
    hide = f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None\nsys.path.insert(0, 'bench')\n"
    return subprocess.run([sys.executable, "-c", hide + code], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_gpu_scripts_parse():
    """A lease is 15 minutes: a shell syntax error in a script found there costs one."""
    scripts = sorted((ROOT / "bench").glob("gpu_*.sh"))
    assert {p.name for p in scripts} >= {"gpu_env.sh", "gpu_adapt.sh", "gpu_finetune.sh"}
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"


@pytest.fixture(scope="module")
def on_the_gpu_machine(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One interpreter as on the GPU machine (run_without_absent) for two tests: every benchmark the GPU
    scripts run imported, then the cost table (bench/adapt_stage_speed.py) and step 1 of gpu_finetune.sh
    (bench/gpu_determinism.py), each at a tiny size into a folder of its own. One interpreter for all:
    each costs seconds of imports. The process, and the two folders."""
    cost, determinism = tmp_path_factory.mktemp("cost"), tmp_path_factory.mktemp("determinism")
    cost_argv = ["adapt_stage_speed.py", "--sizes", "tiny", "--finetune-only", "--families", "bert-b",
                 "--variants", "xdbert", "--finetune-mfu", "0.1", "--full-mfu", "0.04", "--out", str(cost)]
    determinism_argv = ["gpu_determinism.py", "--size", "tiny", "--train", "128", "--out", str(determinism)]
    done = run_without_absent("import adapt_stage_speed, finetune_share, finetune_speed, gpu_determinism, runpy\n"
                              f"sys.argv = {cost_argv!r}\nrunpy.run_path('bench/adapt_stage_speed.py', run_name='__main__')\n"
                              f"sys.argv = {determinism_argv!r}\nrunpy.run_path('bench/gpu_determinism.py', run_name='__main__')")
    return done, cost, determinism


@pytest.mark.slow
def test_the_gpu_benchmarks_import_and_write_the_cost_table_without_ray_dvc_or_datasets(on_the_gpu_machine):
    """Every benchmark the GPU scripts run imports there. Then the finetuning cost of a family, each kind of
    run at its own MFU: encoder runs at the recorded rate, `full` runs (never timed on a GPU) at theirs.
    6 FLOPs per multiplying parameter and real token."""
    done, folder, _ = on_the_gpu_machine
    assert done.returncode == 0, done.stderr[-2000:]
    table = (folder / "adapt_stage_speed.md").read_text(encoding="utf-8")
    assert "| bert-b | - | - |" in table  # the finetuning columns alone, for the family asked
    result = json.loads((folder / "adapt_stage_speed.json").read_text(encoding="utf-8"))
    (cost,) = result["cost"]
    hours, tokens, sizes = cost["finetune_gpu_hours_by_kind"], cost["finetune_tokens_by_kind"], cost["matmul_parameters"]
    assert set(hours) == {"encoder", "full"} and cost["finetune_gpu_hours"] == pytest.approx(sum(hours.values()))
    for kind, rate in (("encoder", 0.1), ("full", 0.04)):
        assert hours[kind] * 3600 * rate * result["peak_tflops"] * 1e12 == pytest.approx(6 * sizes[kind] * tokens[kind])


def finetune_share(tmp_path: Path, monkeypatch, capfd, name: str, *args: str) -> tuple[str, dict]:
    """bench/finetune_share.py at a tiny size, one epoch of 64 examples, with `args`; what it and its run
    processes wrote to stderr, and its JSON. Its main runs in this process, whose torch and transformers are
    imported already (an interpreter of its own spent seconds importing them); the run processes it spawns
    start as they do from the command line, and their stderr is this process's file descriptor 2 (capfd)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import finetune_share as script

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["finetune_share.py", "--size", "tiny", "--train", "64", "--epochs", "1", *args,
                                      "--name", name, "--out", str(tmp_path)])
    try:
        script.main()
    except SystemExit as e:  # a failed row: the script exits 1 after writing its table
        pytest.fail(f"finetune_share.py exited {e.code}: {capfd.readouterr().err[-2000:]}")
    return capfd.readouterr().err, json.loads((tmp_path / f"{name}.json").read_text())


@pytest.mark.slow
def test_finetune_share_reports_both_rates_and_a_profile_of_stacked_seeds(tmp_path, monkeypatch, capfd):
    """The script gpu_finetune.sh runs, at a tiny size on the CPU: 1 and 2 processes sharing the device, the
    rate over whole seeds and the (higher) rate inside the training loops, the single process's profile
    (by GPU time, then by host time) and each process's progress lines. `--stack 2`: each process trains
    its 2 timed seeds as one stacked model, and both are counted; with `--cuda-graph` (on the CPU: the
    same steps, unrecorded). One invocation for all: each spawned process costs seconds of imports."""
    err, result = finetune_share(tmp_path, monkeypatch, capfd, "share", "--task", "sst2", "--runs", "1,2", "--seeds", "2", "--stack", "2",
                                  "--cuda-graph", "--profile", "--sync-debug")
    rows = result["rows"]
    assert [r["runs_per_gpu"] for r in rows] == [1, 2] and not any("error" in r for r in rows)
    assert all(r["loop_tokens_per_second"] > r["tokens_per_second"] > 0 for r in rows)
    assert result["stack"] == 2 and result["cuda_graph"] and [len(r["dev_accuracy"]) for r in rows] == [2, 4]
    table = (tmp_path / "share.md").read_text()
    assert "in loops: real tokens/s" in table and "| 1 x 2 stacked |" in table and "| 2 x 2 stacked |" in table
    assert result["commit_from"] == "git" and f"Code: commit {result['commit'][:12]}" in table
    profile = (tmp_path / "share_profile.txt").read_text()
    assert profile.count("Self CPU time total") == 2  # two tables: by GPU time, by the host's own time
    assert err.count("warmed up in") == 3 and err.count("timed seeds done in") == 3


@pytest.mark.slow
def test_finetune_share_times_the_full_kind_recorded(tmp_path, monkeypatch, capfd):
    """`--kind full` (step 9 of gpu_finetune.sh): the whole cross-modal model trains and is counted as the
    cost table counts `full` runs (parameters outside embedding tables, the paper grid's BERT-b `full` tokens)."""
    _, result = finetune_share(tmp_path, monkeypatch, capfd, "full", "--kind", "full", "--task", "rte", "--runs", "1", "--seeds", "1", "--cuda-graph")
    (row,) = result["rows"]
    assert result["kind"] == "full" and row["loop_tokens_per_second"] > 0 and len(row["dev_accuracy"]) == 1
    assert row["mfu"] == pytest.approx(6 * result["parameters"] * row["tokens_per_second"] / 989e12)
    table = (tmp_path / "full.md").read_text()
    assert "Random cross-modal model on BERT tiny" in table and "BERT-b `full` runs, GPU-hours" in table


def test_finetune_share_refuses_to_stack_a_full_model(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import finetune_share

    monkeypatch.setattr(sys, "argv", ["finetune_share.py", "--kind", "full", "--stack", "2"])
    with pytest.raises(SystemExit) as exit_:
        finetune_share.main()
    assert exit_.value.code == 2 and "only an encoder's seeds are stacked" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_determinism_compares_a_recorded_seed_with_an_eager_one(on_the_gpu_machine):
    """Step 1 of gpu_finetune.sh at a tiny size on the CPU, where nothing is recorded: every comparison,
    eager against recorded included, trains the same bytes."""
    done, _, folder = on_the_gpu_machine
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((folder / "gpu_determinism.json").read_text())
    for mode in ("default", "eager vs recorded", "deterministic"):
        assert result[mode]["losses_equal"] and result[mode]["predictions_equal"], (mode, result[mode])
    assert "| eager vs recorded | True |" in (folder / "gpu_determinism.md").read_text()


# ---------------------------------------------------------------- the commit every result records

def provenance():
    """bench/provenance.py, as the benchmarks import it (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("provenance", ROOT / "bench" / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_result_names_the_commit_and_whether_the_code_had_changes(tmp_path, monkeypatch):
    pv = provenance()
    monkeypatch.setenv(pv.COMMIT, "passed-in-but-git-knows")  # a checkout's own git wins
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "code")
    head = git(tmp_path, "rev-parse", "HEAD")
    version = pv.code_version.__wrapped__  # not the once-per-process cache
    (tmp_path / "bench" / "results" / "speed.json").write_text("{}\n")  # a benchmark's own result: still clean
    assert version(tmp_path) == {"commit": head, "dirty": False, "commit_from": "git"}
    assert pv.describe(version(tmp_path)) == f"Code: commit {head[:12]}, clean."
    (tmp_path / "code.py").write_text("x = 2\n")
    assert version(tmp_path) == {"commit": head, "dirty": True, "commit_from": "git"}
    assert pv.describe(version(tmp_path)) == f"Code: commit {head[:12]}, uncommitted changes."


def test_without_git_the_result_says_the_commit_was_passed_in(tmp_path, monkeypatch):
    pv = provenance()
    version = pv.code_version.__wrapped__
    monkeypatch.delenv(pv.COMMIT, raising=False)
    assert version(tmp_path) == {"commit": None, "dirty": None,
                                 "commit_from": "unknown: no .git here and no XDBERT_COMMIT passed in"}
    monkeypatch.setenv(pv.COMMIT, "0123456789abcdef0123")
    monkeypatch.setenv(pv.DIRTY, "1")
    passed = version(tmp_path)
    assert passed == {"commit": "0123456789abcdef0123", "dirty": True, "commit_from": "passed in (XDBERT_COMMIT, no .git here)"}
    assert pv.describe(passed) == "Code: commit 0123456789ab, uncommitted changes (passed in (XDBERT_COMMIT, no .git here))."
    monkeypatch.delenv(pv.DIRTY)
    assert version(tmp_path)["dirty"] is None


def test_the_lease_scripts_pass_what_provenance_prints(tmp_path):
    """`python bench/provenance.py` here prints the assignments; gpu_env.sh, which every lease script sources,
    writes what it was given beside the results."""
    printed = subprocess.run([sys.executable, "bench/provenance.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert re.fullmatch(r"XDBERT_COMMIT=[0-9a-f]{40} XDBERT_DIRTY=[01]\n", printed.stdout)
    env_sh = (ROOT / "bench" / "gpu_env.sh").read_text()
    assert '"$out/commit.txt"' in env_sh
    for script in ("gpu_adapt.sh", "gpu_finetune.sh"):
        assert "source bench/gpu_env.sh" in (ROOT / "bench" / script).read_text()


def test_every_benchmark_that_writes_a_result_records_the_commit():
    writers = [p for p in sorted((ROOT / "bench").glob("*.py")) if re.search(r"write_text\(|write_json\(", p.read_text())]
    assert len(writers) >= 9
    missing = [p.name for p in writers if "**code_version()" not in p.read_text()]
    assert missing == [], f"benchmarks whose results do not record the commit: {missing}"


@pytest.mark.slow
def test_probes_stage_times_each_row_through_the_stage_and_extrapolates(tmp_path):
    """bench/probes_stage.py at tiny sizes on 0.6 of one relation's subjects: a baseline (its saved MLM head) and the
    reference (the hub mirror's MLM), each timed in parts; the peak memory of the stage and of joblib's workers; the
    times scaled back to all subjects; an encoder without a head extrapolated from the baseline less its cloze, and
    no total: no large encoder or CLIP-T was measured."""
    rows = ["bert-b/baseline", "bert-base-cased"]
    done = subprocess.run([sys.executable, "bench/probes_stage.py", "--sizes", "tiny", "--only", ",".join(rows),
                           "--relations", "shape", "--jobs", "2", "--fraction", "0.6", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "probes_stage.json").read_text())
    measured = result["measured"]
    assert [r["name"] for r in measured["rows"]] == rows and result["relations"] == ["shape"]
    for r in measured["rows"]:
        assert all(r[part] > 0 for part in ("load", "features", "cloze", "rest")), r
        assert r["wall"] == pytest.approx(r["load"] + r["features"] + r["cloze"] + r["rest"])
    assert measured["peak_rss_mib"]["stage"] > 0 and measured["peak_rss_mib"]["children"] > 0
    assert measured["templates"] == {"shape": 3} and measured["comparisons"] == 0
    # the tiny mirror's 16 + 8 subjects of the all group and 3 CoDa test objects: 10 + 5 and 2 kept (0.6, rounded up:
    # the single group's 8 train examples keep 5, one per fold of the profile's 5)
    assert measured["subjects"] == {"shape": 15} and measured["coda_objects"] == 2 and result["fractions"] == [0.6]
    x = result["extrapolated"]
    baseline, reference = measured["rows"]
    assert x["rows"] == 15 and x["total_seconds"] is None
    assert x["missing"] == ["large encoder with MLM head", "large encoder", "CLIP-T"]
    all_subjects = lambda r, parts: r["load"] + sum(r[k] for k in parts) / 0.6  # noqa: E731
    assert x["kinds"]["reference (hub MLM)"]["seconds_per_row"] == pytest.approx(
        all_subjects(reference, ("features", "cloze", "rest")))
    assert x["kinds"]["base encoder"] == {"rows": 8, "seconds_per_row": pytest.approx(all_subjects(baseline, ("features", "rest"))),
                                          "from": "base encoder with MLM head, less the cloze"}
    md = (tmp_path / "probes_stage.md").read_text()
    assert result["commit_from"] == "git" and "| bert-b/baseline | base encoder with MLM head | 0.6 |" in md
    assert "| bert-b/baseline | base encoder with MLM head | all |" in md and "the fits an upper bound" in md


def test_probes_stage_extrapolates_through_the_origin_or_two_shares():
    """One share: in proportion. Two: the line through both, so a part with a fixed cost (the fits: 9.5 s at 0.1 of
    the subjects and 13.9 s at 0.2, about this machine's) is not multiplied with the rest."""
    spec = importlib.util.spec_from_file_location("probes_bench", ROOT / "bench" / "probes_stage.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.at_all_subjects({0.1: 9.5}) == pytest.approx(95.0)
    assert bench.at_all_subjects({0.1: 9.5, 0.2: 13.9}) == pytest.approx(13.9 + 4.4 * 8)  # 5.1 s fixed + 44 s
    assert bench.at_all_subjects({0.2: 20.0, 0.1: 10.0}) == pytest.approx(100.0)  # no fixed part: as in proportion

    def measured(features, rest, differences):
        return {"rows": [{"name": "r", "load": 3.0, "features": features, "cloze": 0.0, "rest": rest}],
                "differences_seconds": differences, "data_seconds": 1.0}
    full = bench.scale({0.2: measured(20.0, 13.9, 2.0), 0.1: measured(10.0, 9.5, 1.0)})
    (row,) = full["rows"]
    assert row["features"] == pytest.approx(100.0) and row["rest"] == pytest.approx(49.1)
    assert row["wall"] == pytest.approx(3.0 + 100.0 + 49.1) and full["differences_seconds"] == pytest.approx(10.0)
