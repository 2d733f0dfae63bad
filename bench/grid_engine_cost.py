"""What the grid's engine costs the embedded study: the finetuning of a reference commit against this
checkout's committed code, alternating, on the same inputs, on one machine.

Only the finetuning differs between the two: the stages before it compute the same in both, so the
embedded `dvc repro` is no slower exactly when its finetuning is no slower. Each side is a git worktree of
its commit (this checkout's side: HEAD), given the workspace's stage inputs (data/, models/, params.yaml;
`dvc repro` must have run). Each round runs every finetuning stage command of that commit's dvc.yaml, in
DVC's order (the reference: one process pool per task; HEAD: one grid, Ray started and stopped inside),
from an empty run cache, and times the whole; the sides alternate (ref, head, head, ref, ...), so drift
in the machine's speed falls on both alike. Nothing else may run meanwhile.

    python bench/grid_engine_cost.py [--ref 09ebaf1] [--rounds 2]

Writes bench/results/grid_engine_cost.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_caps_cost import ROOT, stage_commands  # noqa: E402
from provenance import code_version, describe  # noqa: E402

from xdbert.numerics import cpu_description  # noqa: E402


def worktree(ref: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(where), ref], cwd=ROOT, check=True, capture_output=True)
    for name in ("data", "models"):
        (where / name).symlink_to(ROOT / name)  # read only: the finetuning writes results/ and checkpoints/
    shutil.copy(ROOT / "params.yaml", where / "params.yaml")
    return where


def finetune(work: Path, commands: list[list[str]]) -> float:
    for name in ("results/finetune", "checkpoints/runs"):
        shutil.rmtree(work / name, ignore_errors=True)
    t0 = time.time()
    for argv in commands:
        # one run cache for both sides: the reference commit's own, which HEAD keeps in DVC's cache
        r = subprocess.run([sys.executable, *argv], cwd=work, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(work), "XDBERT_RUN_CACHE": str(work / "checkpoints/runs")})
        if r.returncode:
            raise SystemExit(f"{work.name}: {' '.join(argv)} failed:\n{r.stderr[-3000:]}")
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="09ebaf1", help="the reference commit (before the grid ran on Ray)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    seconds: dict[str, list[float]] = {"ref": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"ref": worktree(args.ref, Path(tmp) / "ref"), "head": worktree("HEAD", Path(tmp) / "head")}
        try:
            commands = {side: [argv for stage, argv in stage_commands(work).items() if stage.startswith("finetune")]
                        for side, work in sides.items()}
            for r in range(args.rounds):
                for side in (("ref", "head") if r % 2 == 0 else ("head", "ref")):
                    seconds[side].append(finetune(sides[side], commands[side]))
                    print(f"round {r + 1} {side}: {seconds[side][-1]:.1f} s", flush=True)
        finally:
            for work in sides.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=ROOT, capture_output=True)
    cpu = cpu_description()
    ratio = sum(seconds["head"]) / sum(seconds["ref"])
    result = {**code_version(), "ref": args.ref, "head": head, "seconds": seconds, "ratio_head_to_ref": ratio, "cpu": cpu,
              "commands": {side: [" ".join(c) for c in cmds] for side, cmds in commands.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grid_engine_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The grid engine's cost on the embedded study: {cpu.get('model name', '?')} (family "
             f"{cpu.get('cpu family', '?')}), {os.cpu_count()} cores", "",
             f"All finetuning of the embedded profile from an empty run cache, {args.rounds} rounds each side, "
             f"alternating. `{args.ref}`: {len(commands['ref'])} stages, a process pool each; `{head}`: "
             f"{len(commands['head'])} stage on Ray (start-up included).", "",
             "| side | seconds per round | total |", "| --- | --- | --- |"]
    for side in ("ref", "head"):
        lines.append(f"| {args.ref if side == 'ref' else head} | {', '.join(f'{x:.1f}' for x in seconds[side])} | "
                     f"{sum(seconds[side]):.1f} |")
    lines += ["", f"**{head} / {args.ref}: {ratio:.3f}x** the time.", "", f"Rerun with `python {' '.join(sys.argv)}`. {describe(result)}"]
    (args.out / "grid_engine_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
