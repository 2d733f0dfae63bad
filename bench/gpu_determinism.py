"""What is deterministic on a GPU: one finetuning seed trained twice, by default and in deterministic mode.

The CPU path gives the same bytes on every x86-64 machine (xdbert/numerics.py); on a GPU some kernels
(atomics in reductions, cuBLAS split-K choices) may add in a different order from run to run. This
trains the pipeline's `train_seed` twice with the default settings and twice with
`torch.use_deterministic_algorithms(True)` (and CUBLAS_WORKSPACE_CONFIG, which cuBLAS needs for it), and
reports whether the losses and the dev predictions were bit-equal, and what the mode costs in time.
Then it trains the seed eagerly and with each step recorded as one CUDA graph (`finetune.cuda_graph`):
the same step replayed, its dropout reseeded each step, should train as the eager one does (AdamW's
rates are fp32 tensors there, so the last bits may differ).

    python bench/gpu_determinism.py [--size base] [--train 2000]

Writes bench/results/gpu_determinism.md and .json (or under --out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts; used only in deterministic mode

import xdbert  # noqa: F401, E402  (first: it fixes the CPU kernels and threads before torch and numpy load)
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_speed import SIZES, build_bert, finetune_settings  # noqa: E402
from provenance import code_version, describe  # noqa: E402

from xdbert.data.synthetic.tasks import generate_task  # noqa: E402
from xdbert.data.tasks.registry import get_task  # noqa: E402
from xdbert.finetuning.compute.loop import train_seed  # noqa: E402
from xdbert.finetuning.control.prepare import prepare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def twice(job, device: str, other=None) -> dict:
    """Seed 0 trained with `job` and again with `other` (default: the same job)."""
    a, b = train_seed(job, 0, device), train_seed(other or job, 0, device)
    split = job.dev_splits[0]
    return {"losses_equal": (a["first_epoch_loss"], a["last_epoch_loss"]) == (b["first_epoch_loss"], b["last_epoch_loss"]),
            "loss_difference": abs(a["last_epoch_loss"] - b["last_epoch_loss"]),
            "predictions_equal": bool(np.array_equal(a["predictions"][split], b["predictions"][split])),
            "train_seconds": [a["train_seconds"], b["train_seconds"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=tuple(SIZES), default="base")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = get_task("rte")
    tables = generate_task("rte", args.train, 400, seed=0)
    settings = finetune_settings(spec, 1e-4, epochs=2, batch_size=32, max_len=128, warmup_ratio=0.1,
                                 weight_decay=0.01, precision="auto", compile=False, length_group=50)
    with tempfile.TemporaryDirectory() as tmp:
        build_bert(Path(tmp) / "bert", tables, spec, args.size)
        job = prepare("encoder", Path(tmp) / "bert", tables, settings)
        train_seed(job, 1, device)  # warm-up: kernels and batch shapes
        result = {**code_version(), "device": torch.cuda.get_device_name(0) if device == "cuda" else "CPU", "torch": torch.__version__,
                  "size": args.size, "default": twice(job, device)}
        graphed = dataclasses.replace(job, hyperparameters=dataclasses.replace(job.hyperparameters, cuda_graph=True))
        result["eager vs recorded"] = twice(job, device, graphed)
        torch.use_deterministic_algorithms(True)
        result["deterministic"] = twice(job, device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_determinism.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Determinism of one finetuning seed on {result['device']}", "",
             f"Random BERT {args.size}, RTE stand-in ({args.train} examples), 2 epochs, bf16 autocast, torch {torch.__version__}. "
             f"{describe(result)}", "",
             "| mode | losses bit-equal | last-loss difference | dev predictions equal | train s (run 1, run 2) |",
             "| --- | --- | --- | --- | --- |"]
    for mode in ("default", "eager vs recorded", "deterministic"):
        r = result[mode]
        lines.append(f"| {mode} | {r['losses_equal']} | {r['loss_difference']:.2e} | {r['predictions_equal']} | "
                     f"{r['train_seconds'][0]:.2f}, {r['train_seconds'][1]:.2f} |")
    (args.out / "gpu_determinism.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
