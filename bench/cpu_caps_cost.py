"""What the CPU kernel caps cost: embedded stages run with and without them, alternating, on one machine.

`import xdbert` caps torch's, MKL's, oneDNN's and OpenBLAS's kernels at AVX2 and fixes the thread counts
(xdbert/numerics.py), so every x86-64 CPU writes the same bytes. On an AVX-512 CPU that could cost
speed. This copies the checkout's code, params and stage inputs (data/, models/, results/, metrics/) to
a scratch folder, so nothing of the workspace is touched, and runs each stage script there `--rounds`
times in each mode, alternating (capped, plain, plain, capped, ...), so drift in the machine's speed
falls on both alike. "plain" puts back the environment the process started with right after `import
xdbert`, before torch is imported, and keeps xdbert/mkl_dispatch.c's library unloaded, so torch, MKL,
oneDNN and OpenBLAS pick their own kernels (on an Intel CPU, MKL its Intel ones); the one thread of a
finetuning run stays (it is code, not environment). The stages' outputs must be in place
(`dvc repro` once).
`--stages all` runs the whole embedded `dvc repro`: every stage's own command, in the order DVC runs them
(from `dvc repro --dry --force`), so the sum is the study's compute without DVC's hashing, which is the
same in both modes.

    python bench/cpu_caps_cost.py [--rounds 2] [--stages all|adapt@bert,finetune,pretrain_encoder@bert]

Writes bench/results/cpu_caps_cost.md and .json (cpu_caps_cost_repro.* for `--stages all`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import code_version, describe  # noqa: E402
from xdbert import numerics  # noqa: E402

# Runs a stage script as DVC would, optionally with the environment from before `import xdbert`.
LAUNCH = """
import os, runpy, sys
before = dict(os.environ)
if sys.argv[1] == "plain":
    sys.modules["xdbert._mkl_dispatch"] = None  # unfound: MKL picks its GEMM kernels by the CPU's vendor
import xdbert
if sys.argv[1] == "plain":
    for key in {keys!r}:
        if key in before:
            os.environ[key] = before[key]
        else:
            os.environ.pop(key, None)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def stage_commands(repo: Path = ROOT) -> dict[str, list[str]]:
    """Every stage of `repo`'s dvc.yaml with the script and arguments of its command, in the order DVC runs them."""
    dry = subprocess.run(["dvc", "repro", "--dry", "--force"], cwd=repo, capture_output=True, text=True, check=True)
    commands, stage = {}, None
    for line in dry.stdout.splitlines():
        if line.startswith("Running stage '"):
            stage = line.split("'")[1]
        elif line.startswith("> python ") and stage:
            commands[stage] = line.split()[2:]
            stage = None
    return commands


def run_stage(work: Path, mode: str, argv: list[str]) -> float:
    keys = [*numerics.CPU_KERNEL_CAPS, *numerics.THREAD_COUNTS]
    cmd = [sys.executable, "-c", LAUNCH.format(keys=keys), mode, *argv]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(work)})
    if r.returncode:
        raise SystemExit(f"{' '.join(argv)} ({mode}) failed:\n{r.stderr[-3000:]}")
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stages", default="adapt@bert,finetune,pretrain_encoder@bert")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    commands = stage_commands()
    stages = list(commands) if args.stages == "all" else args.stages.split(",")
    unknown = sorted(set(stages) - set(commands))
    if unknown:
        raise SystemExit(f"unknown stage(s) {', '.join(unknown)}; dvc.yaml has {', '.join(commands)}")
    seconds: dict[str, dict[str, list[float]]] = {s: {"capped": [], "plain": []} for s in stages}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in ("stages", "xdbert", "data", "models", "results", "metrics", "params.yaml"):
            src = ROOT / name
            shutil.copytree(src, work / name) if src.is_dir() else shutil.copy(src, work / name)
        for r in range(args.rounds):
            order = ("capped", "plain") if r % 2 == 0 else ("plain", "capped")
            for mode in order:
                for stage in stages:
                    seconds[stage][mode].append(run_stage(work, mode, commands[stage]))
                    print(f"round {r + 1} {mode:6} {stage}: {seconds[stage][mode][-1]:.1f} s", flush=True)
    total = {mode: sum(sum(v[mode]) for v in seconds.values()) for mode in ("capped", "plain")}
    from xdbert.numerics import cpu_description

    cpu = cpu_description()
    result = {**code_version(), "cpu": cpu, "rounds": args.rounds, "seconds": seconds, "total": total,
              "ratio_capped_to_plain": total["capped"] / total["plain"], "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    stem = "cpu_caps_cost_repro" if args.stages == "all" else "cpu_caps_cost"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The CPU kernel caps' cost: {cpu.get('model name', '?')} (family {cpu.get('cpu family', '?')}), "
             f"{os.cpu_count()} cores", "",
             f"Each stage script ran {args.rounds} times capped (AVX2 kernels, MKL's Zen path, 2 threads: "
             f"`xdbert/numerics.py`) and {args.rounds} times plain (the machine's own kernels, torch's default threads), alternating, on the "
             "embedded profile's inputs. Seconds per run, start-up included.", "",
             "| stage | capped s | plain s | capped / plain |", "| --- | --- | --- | --- |"]
    for stage, v in seconds.items():
        c, p = sum(v["capped"]), sum(v["plain"])
        lines.append(f"| {stage} | {', '.join(f'{x:.1f}' for x in v['capped'])} | "
                     f"{', '.join(f'{x:.1f}' for x in v['plain'])} | {c / p:.3f} |")
    lines += [f"| **all** | {total['capped']:.1f} | {total['plain']:.1f} | **{result['ratio_capped_to_plain']:.3f}** |",
              "", f"Rerun with `python {' '.join(sys.argv)}`. {describe(result)}"]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
