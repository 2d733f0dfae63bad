"""Score the finetuning grid's estimates of the time left, in a log: the worst error after 10% of the grid's
time, and whether the share shown ever fell.

    python tools/score_eta.py LOG [LOG ...]      a `dvc repro` or `dvc exp run` log; - reads stdin

A grid's lines run from its plan (`finetune: plan: ...`) to its last line (`finetune: 100% of est. time,
445/445 runs, 0:17:02 elapsed, done`), which says how long it took; every line between says its elapsed
time (xdbert.finetuning.control.progress). A line's estimate is within tolerance when it is off the time
really left by at most 25% of it or 30 s, whichever is larger; the lines of the first 10% of the grid's
time are not scored, nor are grids that trained nothing. Prints one line per grid scored. Exit code 1
when an estimate is out of tolerance or the share fell, 2 for a log that cannot be scored (no grid that
trained, a grid that never ended, progress lines without their elapsed time).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xdbert.errors import PipelineError  # noqa: E402
from xdbert.finetuning.control.progress import LINE, PLAN, clock, duration, seconds_of  # noqa: E402
from xdbert.stage import run  # noqa: E402

FROM = 0.10          # lines before this share of the grid's time are not scored
RELATIVE = 0.25      # within 25% of the time really left ...
ABSOLUTE_S = 30.0    # ... or 30 s, whichever is larger


@dataclass
class Score:
    """One grid's score: its time, the lines scored, the worst of them and whether the share fell."""
    seconds: float             # the grid's time, plan to last line
    runs: int
    scored: int                # lines with an estimate after FROM
    outside: int               # of them, out of tolerance (a line with no estimate after FROM counts too)
    worst: float               # the worst line's error over its tolerance (at most 1: within)
    worst_at: float            # its elapsed seconds
    worst_said: float | None   # its estimate (None: no estimate) ...
    worst_true: float          # ... and the time really left
    fell: list[tuple[float, int, int]]  # (elapsed, share before, share after) of each fall

    @property
    def passed(self) -> bool:
        return not self.outside and not self.fell

    def __str__(self) -> str:
        fell = ("never fell" if not self.fell else
                f"fell {len(self.fell)} time(s), first at {clock(self.fell[0][0])} from {self.fell[0][1]}% to {self.fell[0][2]}%")
        if not self.scored:
            worst = "no line after 10% of its time"
        else:
            said = "no estimate" if self.worst_said is None else f"about {duration(self.worst_said)} left"
            error = ("" if self.worst_said is None or not self.worst_true
                     else f", {100 * (self.worst_said - self.worst_true) / self.worst_true:+.0f}%")
            worst = (f"worst at {clock(self.worst_at)}: {said}, {self.worst_true:.0f} s really{error} "
                     f"({self.worst:.2f} of its tolerance, max({RELATIVE:.0%}, {ABSOLUTE_S:.0f} s))")
        return (f"{self.runs} runs in {clock(self.seconds)}: {self.scored} lines scored after {clock(FROM * self.seconds)}, "
                f"{self.outside} out of tolerance; {worst}; the share {fell}: {'PASS' if self.passed else 'FAIL'}")


def grids(lines: list[str], name: str = "log") -> list[list[tuple[int, dict]]]:
    """Each grid's progress lines (line number, LINE's groups), from its plan to its last line; grids that
    trained nothing left out. PipelineError for a log that cannot be scored."""
    found, current = [], None
    for number, line in enumerate(lines, 1):
        line = line.rstrip()
        if PLAN.match(line):
            if current:
                raise PipelineError(f"{name}:{number}: a grid starts before the one at line {current[0][0]} ended "
                                    "(a grid is scored from its plan to its `..., done` line: was it killed?)")
            current = [] if line.endswith(" 0 to train") else [(number, {})]
            continue
        if not line.startswith("finetune: ") or " of est. time, " not in line:
            continue
        match = LINE.match(line)
        if not match:
            raise PipelineError(f"{name}:{number}: {line!r} is no progress line this tool reads; allowed: "
                                "'finetune: P% of est. time, D/N runs, H:MM:SS elapsed, about T left' (or 'no run "
                                "ended yet', or 'done' at the end); logs written before lines said their elapsed time cannot be scored")
        if not current:
            raise PipelineError(f"{name}:{number}: a progress line outside a grid: no `finetune: plan:` line before it")
        groups = match.groupdict()
        if current[1:] and seconds_of(groups["elapsed"]) < seconds_of(current[-1][1]["elapsed"]):
            raise PipelineError(f"{name}:{number}: the elapsed time goes back ({groups['elapsed']} after "
                                f"{current[-1][1]['elapsed']}): two grids' lines mixed?")
        current.append((number, groups))
        if groups["left"] == "done":
            found.append(current[1:])
            current = None
    if current:
        raise PipelineError(f"{name}:{current[0][0]}: the grid that starts here has no last line (`..., done`): "
                            "a grid killed or still running cannot be scored")
    if not found:
        raise PipelineError(f"{name}: no grid that trained a run: a log of `dvc repro` or `dvc exp run` with a "
                            "`finetune: plan:` line, progress lines and a last `..., done` line")
    return found


def score(grid: list[tuple[int, dict]]) -> Score:
    """A grid's lines (`grids`) scored against its last line's elapsed time."""
    end = seconds_of(grid[-1][1]["elapsed"])
    result = Score(seconds=end, runs=int(grid[-1][1]["runs"]), scored=0, outside=0, worst=0.0, worst_at=0.0,
                   worst_said=None, worst_true=0.0, fell=[])
    shown = 0
    for _, line in grid:
        at, share = seconds_of(line["elapsed"]), int(line["share"])
        if share < shown:
            result.fell.append((at, shown, share))
        shown = max(shown, share)
        if line["left"] == "done" or at < FROM * end:
            continue
        true = end - at
        said = seconds_of(line["estimate"]) if line["estimate"] else None
        off = float("inf") if said is None else abs(said - true) / max(RELATIVE * true, ABSOLUTE_S)
        result.scored += 1
        result.outside += off > 1
        if off >= result.worst:
            result.worst, result.worst_at, result.worst_said, result.worst_true = off, at, said, true
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="log files; - reads stdin")
    args = ap.parse_args()
    failed = False
    for log in args.logs:
        if log == "-":
            text = sys.stdin.read()
        elif Path(log).is_file():
            text = Path(log).read_text(errors="replace")
        else:
            raise PipelineError(f"{log}: no such file; allowed: a log file, or - for stdin")
        for i, grid in enumerate(grids(text.splitlines(), log), 1):
            result = score(grid)
            failed |= not result.passed
            print(f"{log}: grid {i} (lines {grid[0][0]}-{grid[-1][0]}): {result}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    run(main, takes_arguments=True)
