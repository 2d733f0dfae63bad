"""The finetuning package's two layers: `compute`, what a run computes, imports no params, no paths and nothing
of `control` (the study's runs, settings, grid and files), so the run cache, keyed by compute's code alone,
keeps every saved run through an edit to the grid and retrains every run after an edit to the loop.

Edits are made to a copy of the package (`keys.code_digest` and `imports.closure` take the folder that holds it).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from xdbert import imports
from xdbert.data.tasks.registry import get_task
from xdbert.finetuning.compute import keys
from xdbert.finetuning.compute.data import Encoded
from xdbert.finetuning.compute.hyperparameters import Hyperparameters
from xdbert.finetuning.compute.job import Job

ROOT = imports.ROOT
COMPUTE = Path("xdbert/finetuning/compute")
CONTROL = Path("xdbert/finetuning/control")
# What a module of compute may not run, directly or through what it imports
FORBIDDEN = ("xdbert.params", "xdbert.paths", "xdbert.finetuning.control")


def compute_modules(root: Path = ROOT) -> list[Path]:
    return sorted((root / COMPUTE).glob("*.py"))


def crossings(modules: list[Path], root: Path = ROOT) -> list[str]:
    """Every import of a forbidden module in the closure of `modules`, as "<file> imports <module>"."""
    out = set()
    for module in modules:
        for path in imports.closure(module, root):
            names = {n for n in imports.imported_modules(path, root) if n.startswith(FORBIDDEN)}
            # `from xdbert.finetuning.control.grid import x` imports the package too: name the module alone
            out |= {f"{path.relative_to(root)} imports {n}" for n in names if not any(m.startswith(n + ".") for m in names)}
    return sorted(out)


def copy_package(folder: Path) -> Path:
    """A copy of the package in `folder`, which then holds it as ROOT holds the package."""
    shutil.copytree(ROOT / "xdbert", folder / "xdbert", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return folder


def add_comment(path: Path) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "# a comment that changes nothing a run computes\n",
                    encoding="utf-8")


def test_compute_imports_no_params_no_paths_and_no_control():
    modules = compute_modules()
    assert {m.name for m in modules} >= {"data.py", "heads.py", "rates.py", "loop.py", "graphed.py", "stacked.py",
                                         "hyperparameters.py", "job.py", "keys.py"}
    assert crossings(modules) == []
    # the other way round is the point: the grid runs the compute modules
    assert ROOT / COMPUTE / "stacked.py" in imports.closure(ROOT / CONTROL / "grid.py")


@pytest.mark.parametrize("planted, named", [
    ("from xdbert.finetuning.control.grid import run_grid\n",
     "xdbert/finetuning/compute/planted.py imports xdbert.finetuning.control.grid"),
    ("from xdbert import paths\n", "xdbert/finetuning/compute/planted.py imports xdbert.paths"),
    ("def later():\n    from xdbert.model.families import Family\n",  # lazily, and params only through it
     "xdbert/model/families.py imports xdbert.params"),
])
def test_the_layer_check_names_a_planted_import(tmp_path, planted, named):
    root = copy_package(tmp_path)
    (root / COMPUTE / "planted.py").write_text(planted, encoding="utf-8")
    assert named in crossings(compute_modules(root), root)


def tiny_job(folder: Path, stack: int) -> Job:
    """An encoder job of two examples per split and a model folder of one file: enough to key runs by."""
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}\n', encoding="utf-8")
    split = Encoded(idx=np.arange(2), labels=np.array([0, 1]), choices=1, inputs={}, pad_ids={},
                    clip_ids=np.zeros((2, 1, 1, 77), dtype=np.uint16))
    h = Hyperparameters(epochs=1, warmup_ratio=0.1, batch_size=2, eval_batch_size=2, max_len=16, weight_decay=0.0,
                        length_group=1, clip_blocks_per_sentence=2, dropout=0.1, precision="no", compile=False,
                        cuda_graph=False, stack=stack, lr=1e-4, layer_lr_decay=1.0, max_grad_norm=1.0)
    return Job("encoder", str(folder), get_task("sst2"), h, {"train": split, "validation": split})


def run_keys(job: Job, root: Path) -> list[str]:
    """The keys of the job's runs of seeds 0 and 1, with its code read under `root`."""
    job.identity = keys.job_identity(job, root)
    return [keys.run_key(job, seed, "cpu", group) for group in keys.groups(job, [0, 1]) for seed in group]


@pytest.mark.parametrize("stack", [1, 2])
def test_a_comment_in_the_scheduler_keeps_every_saved_run(tmp_path, stack):
    before, after = copy_package(tmp_path / "before"), copy_package(tmp_path / "after")
    add_comment(after / CONTROL / "grid.py")
    job = tiny_job(tmp_path / "model", stack)
    assert keys.code_digest(before) == keys.code_digest()  # the copy stands for the package
    assert keys.code_digest(after) == keys.code_digest(before)
    assert len(set(run_keys(job, before))) == 2 and run_keys(job, after) == run_keys(job, before)


@pytest.mark.parametrize("stack", [1, 2])
def test_a_comment_in_the_loop_retrains_every_run(tmp_path, stack):
    before, after = copy_package(tmp_path / "before"), copy_package(tmp_path / "after")
    add_comment(after / COMPUTE / "loop.py")
    job = tiny_job(tmp_path / "model", stack)
    assert keys.code_digest(after) != keys.code_digest(before)
    assert not set(run_keys(job, after)) & set(run_keys(job, before))
