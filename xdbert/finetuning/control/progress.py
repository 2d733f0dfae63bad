"""The grid's log, readable in a `dvc repro` log: its plan as it starts, then how far it is and how long is left.

The grid can take hours, and returns only when its last run ends. So it says at once how many runs it
reuses and trains, then prints a line at every 5% of the estimated time and at least every minute, and a
last line when its last run ends. Every line after the plan says the time elapsed since the plan, so that
a log can be scored afterwards against the time the grid really took (`tools/score_eta.py`):

    finetune: 27% of est. time, 54/445 runs, 0:04:10 elapsed, about 11 min left
    finetune: 100% of est. time, 445/445 runs, 0:17:02 elapsed, done

How the time left is estimated, and why. The runs go costliest first (grid.py), so the runs that end
first are the least like the hundreds of small ones still to come. The estimate used to weigh the runs by
a model fitted to those ended so far, time = a fixed part + a part in proportion to cost (`grid.cost`):
until runs of very different costs had ended it could not tell the fixed part, so it called the grid 75%
done after 47 of 445 runs, then fell to 27% once it could. And no one such model fits a grid: in the
embedded profile the encoder runs of RTE take 3.5 s at a cost of 2.2e10, those of SWAG 15 s at 1.2e11,
CLIP-T's of RTE 5.4 s at 1.0e11; fitted to all 445 runs of a repro afterwards, the model still put the
time of the runs left after the first 100 21% too high, after the first 300 78%. So:

- Each kind of run is measured across its costs early. `probing_order` has each worker start on one of
  the cheapest runs, as a worker's first run also pays for starting the worker (fetching the jobs; on a
  GPU, its context and compiled graphs) and counts only until another run has ended; then a few runs of
  each model kind (encoder, CLIP-T, full: their time for their cost differs), at even steps from the
  kind's costliest to its cheapest, the cheapest first (within a minute the estimate knows what most
  runs are like); then the rest, costliest first. Reordering changes no result, as
  every run is computed alone, under its own key, and it moves the grid's end by seconds (the
  simulations of tests/test_finetuning_progress.py).
- A run's seconds are read off the runs measured of its kind (`curve`): the mean, on a log scale, of the
  runs of its cost; between two measured costs, the straight line between them on log-log axes. Below
  the cheapest cost measured, that run's seconds (a fixed part rules there); above the costliest, a fixed
  part and a part in proportion to cost through the cheapest and the costliest (the seconds per cost of
  all runs where one cost of the kind was measured): a run in flight that is larger than any measured is
  not taken for hours. Runs the run cache gives back count as measured, their recorded seconds scaled by
  how much faster or slower the runs trained now of their kinds went than they predict (they may have been
  timed under another load). Only runs of a kind the reused runs have tell that pace: a change of the
  facts reuses only encoders, and CLIP-T's or the full model's runs, read off the encoders' curve, made
  the reused runs look six times too slow, and the estimate half the time really left.
- A run's recorded seconds leave out what its worker spends outside it: Ray, and its result waiting
  while the stage's process saves another. A free worker takes the next run in order (engine.results),
  so as a run ends the next one starts, and how long a worker held each run is known: that less the
  run's recorded seconds, the median over the runs measured, is added to each run to come.
- The time left is the rest of the schedule played out: each run in flight ends when its predicted time
  is up (not before now), and each run still queued goes, in order, to the worker free first.

The share shown is the time elapsed over the time elapsed plus the time left, and never less than a
share shown before: where an estimate grows, the share stays until the grid catches up with it.

The module computes nothing a run returns: the run cache's key leaves it out, as it leaves out all of the
grid's control, so changing it retrains nothing.
"""
from __future__ import annotations

import bisect
import heapq
import math
import re
import statistics
import time
from collections import deque
from typing import Callable, Hashable, Iterable

STEP = 0.05        # a line at every 5% of the estimated time ...
HEARTBEAT_S = 60   # ... and at least every minute,
TICK_S = 1         # looking at the clock this often while no run ends
PROBES = 24         # runs measured early, shared among the model kinds, at least 2 of each ...
PROBED_FROM = 4 * PROBES  # ... in grids of at least this many runs to train (in smaller ones they change little)

Run = Hashable     # a run group's key in the grid


def say(line: str) -> None:
    """Print at once: DVC reads a stage's stdout through a pipe or a queued experiment's log file, where
    Python holds lines back until its buffer fills."""
    print(line, flush=True)


def duration(seconds: float) -> str:
    """An estimate as a log says it: 40 s (at least 5), 4 min 30 s (to 10 s under 10 minutes), 14 min,
    2 h 5 min."""
    if seconds < 60:
        return f"{max(round(seconds / 5), 1) * 5} s"
    if seconds < 600:
        minutes, rest = divmod(round(seconds / 10) * 10, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def clock(seconds: float) -> str:
    """Elapsed time as h:mm:ss."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


# A progress line, as `Progress.line` writes it, and its parts as `tools/score_eta.py` reads them
LINE = re.compile(r"^finetune: (?P<share>\d+)% of est\. time, (?P<done>\d+)/(?P<runs>\d+) runs, "
                  r"(?P<elapsed>\d+:\d\d:\d\d) elapsed, (?P<left>about (?P<estimate>.+) left|no run ended yet|done)$")
PLAN = re.compile(r"^finetune: plan: ")
DURATION = re.compile(r"(?:(\d+) h)? ?(?:(\d+) min)? ?(?:(\d+) s)?")


def seconds_of(text: str) -> float:
    """The seconds of a `duration` or `clock` text; ValueError for anything else."""
    if re.fullmatch(r"\d+:\d\d:\d\d", text):
        h, m, s = map(int, text.split(":"))
        return 3600.0 * h + 60 * m + s
    match = DURATION.fullmatch(text)
    if not text or not match:
        raise ValueError(f"{text!r} is no duration (allowed: 40 s, 4 min 30 s, 14 min, 2 h 5 min, 0:04:10)")
    h, m, s = (int(g) if g else 0 for g in match.groups())
    return 3600.0 * h + 60 * m + s


def probing_order(runs: list, workers: int, kind: Callable[[Run], str] = lambda run: "") -> list:
    """`runs` (costliest first), each worker starting on one of the cheapest, which also pays for starting
    the worker; then a few runs of each kind (`kind(run)`: the model kind, whose time for its cost differs
    from the other kinds'), at even steps from the kind's costliest to its cheapest: about PROBES in all,
    shared in proportion to the kinds' runs, at least 2 of each, the cheapest first; then the rest. The same order where there
    are fewer runs than PROBED_FROM."""
    n = len(runs)
    if n < PROBED_FROM:
        return list(runs)
    warm = list(range(n - min(workers, n // 4), n))
    kinds: dict[str, list[int]] = {}
    for i in range(n - len(warm)):
        kinds.setdefault(kind(runs[i]), []).append(i)
    probes = set()
    for of_kind in kinds.values():
        k = min(len(of_kind), max(2, round(PROBES * len(of_kind) / n)))
        step = (len(of_kind) - 1) / max(k - 1, 1)
        probes |= {of_kind[round(j * step)] for j in range(k)}
    first = warm + sorted(probes, reverse=True)
    moved = set(first)
    return [runs[i] for i in first] + [run for i, run in enumerate(runs) if i not in moved]


def means(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The costs measured, ascending, and the mean log seconds of the runs of each, from (cost, seconds)."""
    logs: dict[float, list[float]] = {}
    for cost, seconds in points:
        if cost > 0 and seconds > 0:
            logs.setdefault(cost, []).append(math.log(seconds))
    costs = sorted(logs)
    return costs, [statistics.fmean(logs[c]) for c in costs]


def slope(costs: list[float], logs: list[float]) -> float:
    """Seconds per unit of cost on the line through the cheapest and the costliest cost measured (not
    falling); in proportion to cost where only one was."""
    if len(costs) == 1:
        return math.exp(logs[0]) / costs[0]
    return max(math.exp(logs[-1]) - math.exp(logs[0]), 0.0) / (costs[-1] - costs[0])


def curve(points: Iterable[tuple[float, float]], beyond: float | None = None) -> Callable[[float], float] | None:
    """The seconds of a run of a cost, from measured (cost, seconds): the geometric mean of the runs of
    that cost, and between two measured costs the straight line between them on log-log axes. Below the
    cheapest, its seconds; above the costliest, its seconds and `slope` seconds per unit of cost beyond
    it, or `beyond` where only one cost was measured. None without points."""
    costs, logs = means(points)
    if not costs:
        return None
    per_cost = beyond if len(costs) == 1 and beyond is not None else slope(costs, logs)
    xs = [math.log(c) for c in costs]

    def seconds(cost: float) -> float:
        if cost <= costs[0]:
            return math.exp(logs[0])
        if cost >= costs[-1]:
            return math.exp(logs[-1]) + per_cost * (cost - costs[-1])
        i = bisect.bisect_right(xs, math.log(cost))
        f = (math.log(cost) - xs[i - 1]) / (xs[i] - xs[i - 1])
        return math.exp(logs[i - 1] + f * (logs[i] - logs[i - 1]))
    return seconds


def curves(points: list[tuple[str, float, float]]) -> Callable[[str, float], float] | None:
    """The seconds of a run of a kind and a cost, from measured (kind, cost, seconds): the `curve` of the
    runs of its kind, or of all runs for a kind none was measured of; above the costliest of a kind of
    which one cost was measured, the seconds per cost of all runs. None without points."""
    costs, logs = means((c, s) for _, c, s in points)
    if not costs:
        return None
    beyond = slope(costs, logs)
    overall = curve(((c, s) for _, c, s in points), beyond)
    by_kind = {kind: curve(((c, s) for k, c, s in points if k == kind), beyond) for kind in {k for k, _, _ in points}}
    return lambda kind, cost: (by_kind.get(kind) or overall)(cost)


class Progress:
    """The plan, the progress lines and the estimate of the time left of a grid's runs to train."""

    def __init__(self, say: Callable[[str], None] = say, clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.clock = say, clock
        self.start = self.last_line = clock()
        self.run: dict[Run, tuple[int, float, str]] = {}  # (runs, cost, kind) of each run group to train
        self.queue: deque[Run] = deque()                  # not started, in the order the workers take them
        self.running: dict[Run, float] = {}               # in flight: when it started
        self.first: set[Run] = set()                      # a worker's first run: it also starts the worker
        self.measured: list[tuple[str, float, float]] = []  # (kind, cost, seconds) of the runs trained ...
        self.firsts: list[tuple[str, float, float]] = []    # ... and of the first runs, apart
        self.reused: list[tuple[str, float, float]] = []    # ... and of the reused run groups, as recorded
        self.outside: list[float] = []                    # seconds a worker held a run beyond the run's own
        self.workers = 1
        self.runs = self.runs_done = 0
        self.shown = 0.0                                  # the share said last: it never falls
        self.steps_said = 0

    def plan(self, total: int, reused: int, workers: int, order: list[tuple[Run, int, float, str]],
             timed: Iterable[tuple[str, float, float]] = ()) -> None:
        """The first line: runs in all, reused, to train (`order`: (key, runs, cost, model kind) of each run
        group, in the order the workers take them), on how many workers, and an estimate of the time from
        `timed`, the (model kind, cost, seconds) of the reused run groups as they were trained, where any."""
        self.run = {key: (runs, cost, kind) for key, runs, cost, kind in order}
        self.queue = deque(key for key, _, _, _ in order)
        self.runs = sum(runs for _, runs, _, _ in order)
        self.reused = [(k, c, s) for k, c, s in timed if c > 0 and s > 0]
        self.workers = max(workers, 1)
        left = self.left(self.clock())
        estimate = f"est. {duration(left)}" if left is not None else "an estimate once the first runs end"
        trains = f"{self.runs} to train on {workers} worker{'s' * (workers != 1)} ({estimate})" if self.runs else "0 to train"
        self.say(f"finetune: plan: {total} runs, {reused} reused, {trains}")
        self.start = self.last_line = self.clock()

    def skip(self, keys: list[Run], where: str) -> None:
        """Runs the plan counted to train that were found saved after all (by a cluster's other device)."""
        if keys:
            runs = sum(self.run.pop(key)[0] for key in keys)
            self.queue = deque(key for key in self.queue if key in self.run)
            self.runs -= runs
            self.say(f"finetune: {runs} more runs reused, saved on {where}: {self.runs} to train")

    def start_runs(self) -> None:
        """The workers take their first runs now."""
        now = self.clock()
        while self.queue and len(self.running) < self.workers:
            key = self.queue.popleft()
            self.running[key] = now
            self.first.add(key)

    def predictor(self) -> Callable[[str, float], float] | None:
        """The seconds a run group of a kind and a cost records (`curves` of the runs measured and of the
        reused ones, at the pace of the runs measured of the reused runs' kinds)."""
        measured = self.measured or self.firsts
        pace = 1.0
        alike = [(k, c, s) for k, c, s in measured if k in {kind for kind, _, _ in self.reused}]
        if alike:
            before = curves(self.reused)
            pace = statistics.median(s / before(k, c) for k, c, s in alike)
        return curves(measured + [(k, c, s * pace) for k, c, s in self.reused])

    def left(self, now: float) -> float | None:
        """Seconds until the last run ends, the schedule played out with the predicted times; None
        before anything is timed."""
        seconds = self.predictor()
        if seconds is None:
            return None if self.queue or self.running else 0.0
        outside = max(statistics.median(self.outside), 0.0) if self.outside else 0.0
        takes = {key: seconds(self.run[key][2], self.run[key][1]) + outside for key in [*self.running, *self.queue]}
        free = [max(started + takes[key] - now, 0.0) for key, started in self.running.items()]
        free += [0.0] * max(self.workers - len(free), 0)
        heapq.heapify(free)
        for key in self.queue:
            heapq.heapreplace(free, free[0] + takes[key])
        return max(free)

    def update(self, now: float) -> float | None:
        """The time left, the share shown raised to what it makes."""
        left = self.left(now)
        elapsed = now - self.start
        if left is not None and elapsed + left > 0:
            self.shown = max(self.shown, elapsed / (elapsed + left))
        return left

    def line(self, now: float, left: float | None) -> None:
        estimate = "no run ended yet" if left is None else f"about {duration(left)} left"
        self.say(f"finetune: {int(100 * self.shown + 1e-9)}% of est. time, {self.runs_done}/{self.runs} runs, "
                 f"{clock(now - self.start)} elapsed, {estimate}")
        self.last_line = now

    def done(self, key: Run, seconds: float = 0.0) -> None:
        """The run group `key` just ended, its result recording `seconds` (0: not measured), and the next
        run in order starts: a line if the share crossed a step of STEP or a minute passed, the last line
        ("done") after the last run."""
        now = self.clock()
        started = self.running.pop(key, None)
        if key in self.queue:  # ended without starting here: the workers took another order
            self.queue.remove(key)
        if self.queue:
            self.running[self.queue.popleft()] = now
        runs, cost, kind = self.run[key]
        self.runs_done += runs
        if seconds > 0:
            (self.firsts if key in self.first else self.measured).append((kind, cost, seconds))
            if started is not None and key not in self.first:
                self.outside.append(now - started - seconds)
        if self.runs_done >= self.runs:
            self.shown = 1.0
            self.say(f"finetune: 100% of est. time, {self.runs_done}/{self.runs} runs, {clock(now - self.start)} elapsed, done")
            return
        left = self.update(now)
        steps = int(self.shown / STEP + 1e-9)
        if steps > self.steps_said or now - self.last_line >= HEARTBEAT_S:
            self.steps_said = steps
            self.line(now, left)

    def tick(self) -> None:
        """No run ended for a while: a line if a minute passed since the last."""
        now = self.clock()
        if now - self.last_line >= HEARTBEAT_S and self.runs_done < self.runs:
            self.line(now, self.update(now))
