"""The DVC graph itself: a fresh repository runs, a second run skips, a changed param reruns what depends on it;
then the fault campaign's short form on the project these tests reproduced."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import faults  # noqa: E402
from dvc_cli import ran, sh  # noqa: E402

pytestmark = pytest.mark.slow  # every test here runs `dvc repro` on a project of its own


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A copy of the pipeline with the micro profile (every stage, toy sizes), in its own git + DVC repository."""
    repo = tmp_path_factory.mktemp("pipeline") / "micro"
    faults.make_project(repo)
    return repo


def test_repro_runs_then_skips_then_reruns_only_what_changed(repo):
    first = sh("dvc", "repro", "dual_tokenize", cwd=repo)
    assert ran(first) == {"corpus", "dual_tokenize"}
    assert (repo / "data/shards/manifest.json").is_file()

    again = sh("dvc", "repro", "dual_tokenize", cwd=repo)
    assert ran(again) == set() and "didn't change, skipping" in again

    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["tokenize"]["max_len"] = 40
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    changed = sh("dvc", "repro", "dual_tokenize", cwd=repo)
    assert ran(changed) == {"dual_tokenize"}
    assert yaml.safe_load((repo / "data/shards/manifest.json").read_text())["max_len"] == 40


def test_exp_run_with_more_epochs_reruns_adapt_only(repo):
    first = sh("dvc", "repro", "ablate@mlm", cwd=repo)
    assert ran(first) >= {"pretrain_encoder@bert", "pretrain_clip", "ablate@mlm"}  # both towers' stand-ins come first
    assert "pretrain_encoder@electra" not in ran(first)  # an ablation is `adapt.family`'s alone
    clip = yaml.safe_load((repo / "metrics/pretrain_clip.json").read_text())
    assert clip["steps"] == 20 and clip["last_lm_loss"] < clip["first_lm_loss"]
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline run", cwd=repo)
    log = sh("dvc", "exp", "run", "-S", "adapt.epochs=2", "ablate@mlm", cwd=repo)
    assert ran(log) == {"ablate@mlm"}
    shown = sh("dvc", "exp", "show", "--csv", cwd=repo)
    assert "adapt.epochs" in shown and "valid_mlm_loss" in shown
    rows = [r for r in shown.splitlines() if r and not r.startswith("Experiment")]
    assert len(rows) >= 2  # the workspace/baseline and the experiment
    # The experiment stays in the workspace (adapt.epochs: 2 for every adaptation after it): back to the
    # committed baseline, which the tests below build on
    sh("git", "checkout", "--", ".", cwd=repo)
    sh("dvc", "checkout", "ablate@mlm", cwd=repo)
    assert "up to date" in sh("dvc", "status", "ablate@mlm", cwd=repo)


def test_the_whole_graph_runs_then_skips(repo):
    """Every stage script runs under DVC (a stage no unit test drives end to end still gets run), for both
    families of the micro profile; the reports and pictures exist and link each other, and a second
    `dvc repro` runs nothing."""
    first = sh("dvc", "repro", cwd=repo)
    stages = {s.split("@")[0] for s in ran(first)} | {s for s in ran(first)}
    # pretrain_encoder@bert and pretrain_clip ran, here or for ablate@mlm above
    for family in ("bert", "electra"):
        assert (repo / f"models/pretrain_encoder/{family}/config.json").is_file()
        assert {f"adapt@{family}", f"adapt_baseline@{family}"} <= stages, first
    assert json.loads((repo / "models/pretrain_encoder/electra/config.json").read_text())["model_type"] == "electra"
    assert (repo / "models/pretrain_clip/clip_config.json").is_file()
    for name in ("tasks", "pretrain_encoder@electra", "aggregate", "pwcca", "grounding", "attention", "mechanism"):
        assert name in stages, first
    # the mechanism study, at toy sizes (its captions and twin may have run for ablate@mlm above): the twin
    # tower and its variant, the vis task's runs, and a report with all five gates
    assert (repo / "data/captions/facts.json").is_file() and "ablate@nofacts" in stages, first
    assert (repo / "models/pretrain_clip_nofacts/clip_config.json").is_file()
    assert (repo / "results/finetune/vis/clip_nofacts_t/metrics.json").is_file()
    mechanism = (repo / "reports/mechanism.md").read_text()
    for gate in "ABCDE":
        assert f"\n| {gate} | " in mechanism and (f"| {gate} | " in mechanism), mechanism
    assert "Mechanism study (reports/mechanism.md): gates A " in (repo / "reports/table1.md").read_text()
    assert "finetune" in stages
    for report in ("table1.md", "table2.md", "table3.md", "table6.md", "table8.md", "figure4.md", "attention.md"):
        assert (repo / "reports" / report).stat().st_size > 0
    assert (repo / "reports/figure4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pictures = sorted((repo / "reports/attention").glob("*.png"))
    assert pictures and all(p.read_bytes()[:4] == b"\x89PNG" for p in pictures)
    attention_md = (repo / "reports/attention.md").read_text()
    assert all(f"attention/{p.name}" in attention_md for p in pictures)
    assert "figure4.png" in (repo / "reports/figure4.md").read_text()
    adaptation = (repo / "reports/table3.md").read_text().split("## Adaptation")[1]
    for variant in ("baseline", "xdbert", "mlm_match", "placeholder"):
        assert f"\n| {variant} | " in adaptation, adaptation
    assert "| baseline | " in adaptation and adaptation.split("| baseline | ")[1].split("\n")[0].count("| - ") == 3  # no MATCH (nor its majority class), no CLIPTC
    # Table 3 under its own protocol (the micro profile sets one): its rows of Table 1's models are runs of their own
    table3 = (repo / "reports/table3.md").read_text()
    assert "Table 3's own protocol" in table3 and "lr 0.002 for every task, seeds 0, 1 on every task" in table3
    assert "2 per task (0, 1), RTE included" in table3 and "*wiki (14G), same steps*" in table3
    for task in ("rte", "cola"):
        own = json.loads((repo / f"results/finetune/{task}/bert/table3_xdbert/metrics.json").read_text())
        assert (own["protocol"], own["hyperparameters"]["lr"], own["seeds_list"]) == ("ablation", 2e-3, [0, 1])
    table1 = json.loads((repo / "results/finetune/rte/bert/xdbert/metrics.json").read_text())
    assert (table1["protocol"], table1["seeds_list"]) == ("table1", [0, 1, 2])
    # the second family: its own recipe, Table 1's rows and Table 8's, and no ablation runs
    electra = json.loads((repo / "results/finetune/rte/electra/xdbert/metrics.json").read_text())
    assert (electra["family"], electra["hyperparameters"]["layer_lr_decay"]) == ("electra", 0.8)
    assert sorted(p.name for p in (repo / "results/finetune/rte/electra").iterdir()) == ["baseline", "full_xdbert", "xdbert"]
    rows = [line.split(" | ")[0] for line in (repo / "reports/table1.md").read_text().splitlines() if line.startswith("| ")]
    assert {"| CLIP-T", "| BERT-tiny", "| XDBERT-tiny", "| ELECTRA-micro", "| XDELECTRA-micro"} <= set(rows), rows
    assert "| XELECTRA-micro | " in (repo / "reports/table8.md").read_text()

    again = sh("dvc", "repro", cwd=repo)
    assert ran(again) == set(), again

    # A param the stage alone can check against the adapted model (its encoder's positions): one line, exit 2,
    # and the maps already written stay
    kept, params = (repo / "reports/attention.md").read_bytes(), (repo / "params.yaml").read_text()
    p = yaml.safe_load(params)
    p["attention"]["max_len"] = 1000
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    r = subprocess.run([sys.executable, "stages/attention.py"], cwd=repo, capture_output=True, text=True, env=faults.env_for(repo))
    (repo / "params.yaml").write_text(params)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: `attention.max_len: 1000` is longer than the 64 positions of models/crossmodal/bert/xdbert's encoder; "
        "allowed: at most 64"], r.stderr
    assert (repo / "reports/attention.md").read_bytes() == kept

    # One ablation variant changes: its adaptation reruns, and of the finetuning only its runs train; DVC
    # reruns the grid stage, which reads every other run back from the run cache in DVC's cache. Up to the
    # grid: the stages after it (a minute or two of this test) rerun on any variant's change and say
    # nothing more here.
    whole = (repo / "params.yaml").read_text()
    p = yaml.safe_load(whole)
    p["adapt"]["variants"]["one_cross"]["init_range"] = 0.03
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    changed = sh("dvc", "repro", "finetune", cwd=repo)
    assert ran(changed) == {"ablate@one_cross", "finetune"}, changed
    for task in ("rte", "mrpc", "stsb", "cola"):
        trained = [line for line in changed.splitlines() if line.startswith(f"finetune {task}: ") and "runs reused" in line]
        assert len(trained) == 1 and trained[0].endswith(", 2 trained"), trained  # one_cross's 2 seeds
    plan = [line for line in changed.splitlines() if line.startswith("finetune: plan: ")]
    assert len(plan) == 1 and " reused, 8 to train on " in plan[0], plan  # said before any run trains
    # Back to the whole graph's params, which the tests below build on: DVC's run cache gives both stages'
    # outputs back, nothing runs.
    (repo / "params.yaml").write_text(whole)
    back = sh("dvc", "repro", "finetune", cwd=repo)
    assert ran(back) == set() and back.count("is cached - skipping run") == 2, back
    assert "up to date" in sh("dvc", "status", cwd=repo)


def test_a_pushed_run_is_pulled_not_recomputed(repo, tmp_path):
    """How a team shares a day's outputs: push them to a DVC remote; a fresh clone pulls them, `dvc status`
    is clean and `dvc repro` runs nothing (runs after the whole graph above)."""
    assert (repo / "reports/table1.md").is_file(), "needs test_the_whole_graph_runs_then_skips first"
    remote = tmp_path / "remote"
    sh("dvc", "remote", "add", "-d", "team", str(remote), cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results", cwd=repo)
    sh("dvc", "push", cwd=repo)

    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(repo), str(clone), cwd=tmp_path)
    assert not (clone / "reports/table1.md").exists()
    sh("dvc", "pull", cwd=clone)
    assert (clone / "reports/table1.md").read_bytes() == (repo / "reports/table1.md").read_bytes()
    assert "up to date" in sh("dvc", "status", cwd=clone)
    assert ran(sh("dvc", "repro", cwd=clone)) == set()


def test_the_short_campaign_loses_nothing(repo, tmp_path):
    """One kill per stage, four damaged inputs and a full disk, on a copy of the project reproduced above: every
    fault survived. The full campaign's other inputs to damage are outputs of that project (checkpoints
    excepted: its kills leave them), so it does not stop at a renamed path."""
    missing = [path for _, path, _, _ in faults.DAMAGE if not path.startswith("checkpoints/") and not (repo / path).exists()]
    assert not missing, missing
    r = subprocess.run([sys.executable, str(ROOT / "tools/faults.py"), "--short", "--project", str(repo), "--work",
                        str(tmp_path), "--report", str(tmp_path / "report.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "reference: dvc repro in" in r.stdout
    counts = json.loads((tmp_path / "report.json").read_text())["counts"]
    assert counts["injected"] >= 9 and counts["survived"] == counts["injected"], counts
