"""Runs `stages/adapt.py bert VARIANT` for each VARIANT in this process, in the folder ROOT/rank<RANK>/VARIANT.

    python tests/adapt_processes.py ROOT VARIANT [VARIANT ...]

tests/test_adaptation.py starts it once alone and WORLD_SIZE times together (gloo on the CPU, with the
env `accelerate launch` would set), so the stage's own code runs as it runs once per GPU.
"""
import os
import runpy
import sys
from pathlib import Path

from xdbert.numerics import THREADS  # first: importing xdbert fixes the CPU numerics torch reads at import

import torch

STAGE = Path(__file__).resolve().parents[1] / "stages" / "adapt.py"

# The processes share the machine's THREADS cores, one core each where there are enough, as they would have
# a GPU each: with THREADS threads apiece, two processes on 2 cores took 3.6x as long as one.
torch.set_num_threads(max(1, THREADS // int(os.environ.get("WORLD_SIZE", "1"))))
root = Path(sys.argv[1]) / f"rank{os.environ.get('RANK', '0')}"
for variant in sys.argv[2:]:
    os.chdir(root / variant)
    sys.argv = ["stages/adapt.py", "bert", variant]
    runpy.run_path(str(STAGE), run_name="__main__")
