"""DVC experiments and the finetuning run cache: the workspace, a `--temp` experiment and a queued one all
find the same cache. Apart from tests/test_pipeline.py, which holds the suite's longest chain of tests on one
worker, because this one needs no reproduced project."""
import time

import pytest
import yaml
from dvc_cli import sh

from xdbert import paths

pytestmark = pytest.mark.slow  # `dvc exp run` on a project of its own


def test_every_experiment_of_a_repository_finds_one_run_cache(tmp_path):
    """`paths.run_cache` in the workspace, in a `--temp` experiment and in a queued one (both run in a copy
    under .dvc/tmp/exps without git-ignored files): the same folder, in the repository's DVC cache."""
    repo, seen = tmp_path / "repo", tmp_path / "seen.txt"
    repo.mkdir()
    (repo / "params.yaml").write_text("n: 0\n")
    (repo / "where.py").write_text("import sys\nfrom xdbert import paths\n"
                                   "with open(sys.argv[1], 'a') as f:\n    f.write(f'{paths.run_cache().resolve()}\\n')\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"where": {"cmd": f"python where.py {seen}", "params": ["n"]}}}))
    sh("git", "init", "-q", cwd=repo)
    sh("dvc", "init", "-q", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base", cwd=repo)
    sh("dvc", "repro", cwd=repo)
    sh("dvc", "exp", "run", "--temp", "-S", "n=1", cwd=repo)
    sh("dvc", "exp", "run", "--queue", "-S", "n=2", cwd=repo)
    try:
        # its worker lives on for seconds after the experiment ran; the loop below waits for the experiment only
        sh("dvc", "queue", "start", cwd=repo, log=tmp_path / "queue-start.log")
        for _ in range(300):
            if seen.is_file() and len(seen.read_text().splitlines()) == 3:
                break
            time.sleep(0.5)
    finally:
        sh("dvc", "queue", "stop", cwd=repo)
    assert seen.read_text().splitlines() == [str((repo / ".dvc" / "cache" / paths.RUN_CACHE_NAME).resolve())] * 3
