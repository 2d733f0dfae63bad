"""The benchmarks that bench/gpu_*.sh run on the GPU machine need none of the packages it lacks.

That machine has torch, transformers, accelerate and pyarrow, and the wheels the scripts carry, but not
Ray, DVC or datasets. A benchmark that imported one of them lost a whole lease's results once.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("ray", "dvc", "dvclive", "datasets")


def run_without_absent(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where importing any of ABSENT fails, as on the GPU machine."""
    hide = f"import sys\nfor name in {ABSENT!r}:\n    sys.modules[name] = None\nsys.path.insert(0, 'bench')\n"
    return subprocess.run([sys.executable, "-c", hide + code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_gpu_benchmarks_import_without_ray_dvc_or_datasets():
    done = run_without_absent("import adapt_stage_speed, finetune_share, finetune_speed")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_adapt_cost_table_is_written_without_ray_dvc_or_datasets(tmp_path):
    argv = ["adapt_stage_speed.py", "--sizes", "tiny", "--finetune-only", "--families", "bert-b",
            "--variants", "xdbert", "--out", str(tmp_path)]
    done = run_without_absent(f"import runpy\nsys.argv = {argv!r}\nrunpy.run_path('bench/adapt_stage_speed.py', run_name='__main__')")
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "adapt_stage_speed.md").read_text(encoding="utf-8")
    assert "| bert-b | - | - |" in table  # the finetuning column alone, for the family asked
