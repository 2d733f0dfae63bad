"""One adaptation process per GPU, without a flag to remember.

`dvc repro` runs `python stages/adapt.py FAMILY VARIANT`. On a machine with several visible GPUs the stage
starts itself again under `accelerate launch`, one process per GPU, and waits for them: every GPU
trains, and the outputs are the ones the processes write (the main one alone). `CUDA_VISIBLE_DEVICES`
chooses which GPUs; a single GPU or the CPU trains in the stage's own process.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

# Set by `accelerate launch` and torchrun in every process they start: such a process trains itself.
LAUNCHED = ("LOCAL_RANK", "WORLD_SIZE")


def launch_command(argv: list[str], n_gpus: int, env: Mapping[str, str] = os.environ) -> list[str] | None:
    """The command that runs `argv` (a stage script and its arguments) once per GPU, or None where
    this process trains itself: fewer than 2 GPUs, or already one of several launched processes."""
    if n_gpus < 2 or any(key in env for key in LAUNCHED):
        return None
    # mixed precision is the loop's own (xdbert.training.Precision), so accelerate's is off
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
            "--num_processes", str(n_gpus), "--mixed_precision", "no", "--dynamo_backend", "no", *argv]
