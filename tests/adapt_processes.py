"""Runs `stages/adapt.py bert VARIANT` for each VARIANT in this process, in the folder ROOT/rank<RANK>/VARIANT.

    python tests/adapt_processes.py ROOT VARIANT [VARIANT ...]

tests/test_adaptation.py starts it once alone and WORLD_SIZE times together (gloo on the CPU, with the
env `accelerate launch` would set), so the stage's own code runs as it runs once per GPU.
"""
import os
import runpy
import sys
from pathlib import Path

STAGE = Path(__file__).resolve().parents[1] / "stages" / "adapt.py"

root = Path(sys.argv[1]) / f"rank{os.environ.get('RANK', '0')}"
for variant in sys.argv[2:]:
    os.chdir(root / variant)
    sys.argv = ["stages/adapt.py", "bert", variant]
    runpy.run_path(str(STAGE), run_name="__main__")
