"""The grid's log, readable in a `dvc repro` log: its plan as it starts, then how far it is.

The grid can take hours, and returns only when its last run ends. So it says at once how many runs it
reuses and trains, then prints a line at every 5% of the estimated time done and at least every minute.
Progress is weighed by each run's expected time, not counted in runs: the longest runs go first, and the
first runs to finish are a larger share of the work than their number. A run's time is modelled as a
fixed part (loading, evaluating) plus a part in proportion to its cost (`grid.cost`, its FLOPs):
seconds = a + b x cost, fitted to the runs that took a measured time, the reused ones and those this
grid trained. Cost alone made the estimate front-loaded: the many small runs at the end of a grid,
"2% of the cost", took a quarter of its time. Until runs of costs SPREAD apart have ended, the model is
cost alone. The module computes nothing a run returns: the run cache's key leaves it out, as it leaves out
all of the grid's control, so changing it retrains nothing. The time left is the work left at the rate the finished runs went; before any has
finished, the fitted seconds of the runs to train over the workers, where the grid reuses any.
"""
from __future__ import annotations

import time
from typing import Callable

STEP = 0.05        # a line at every 5% of the estimated cost done ...
HEARTBEAT_S = 60   # ... and at least every minute,
TICK_S = 1         # looking at the clock this often while no run ends
SPREAD = 10        # the fixed part is fitted once the runs timed differ this much in cost per run


def say(line: str) -> None:
    """Print at once: DVC reads a stage's stdout through a pipe or a queued experiment's log file, where
    Python holds lines back until its buffer fills."""
    print(line, flush=True)


def duration(seconds: float) -> str:
    """`seconds` as a log says it: under 1 min, 4 min, 2 h 5 min."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under 1 min"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def fit(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(a, b) of seconds = a x runs + b x cost, least squares over `points` (runs, cost, seconds), both at
    least 0; in proportion to cost alone (a = 0) while the points cannot tell a from b, and (0, 1) without
    points, when only the shares of cost count."""
    srr = sum(r * r for r, _, _ in points)
    scc = sum(c * c for _, c, _ in points)
    src = sum(r * c for r, c, _ in points)
    srs = sum(r * t for r, _, t in points)
    scs = sum(c * t for _, c, t in points)
    det = srr * scc - src * src
    if not points or scc <= 0:
        return 0.0, 1.0
    per_run = [c / r for r, c, _ in points]
    # The grid runs the costliest first: a fixed part fitted to runs of about one cost is noise, and
    # multiplied by the hundreds of small runs still to come, it said "4 h left" of a 40-minute grid.
    if max(per_run) < SPREAD * min(per_run) or det <= 1e-9 * srr * scc:
        return 0.0, scs / scc
    a, b = (srs * scc - scs * src) / det, (scs * srr - srs * src) / det
    if a < 0:            # no fixed part: the time in proportion to cost alone
        return 0.0, max(scs / scc, 1e-12)
    if b <= 0:           # no part in proportion to cost: a fixed time per run
        return max(srs / srr, 1e-12), 0.0
    return a, b


class Progress:
    """Counts the runs, cost and time of a grid's runs to train, and says how far it is."""

    def __init__(self, runs: int, cost: float, say: Callable[[str], None] = say,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runs, self.cost = runs, cost    # to train
        self.runs_done, self.cost_done = 0, 0.0
        self.say, self.clock = say, clock
        self.start = self.last_line = clock()
        self.steps_said = 0                  # of STEP
        self.points: list[tuple[int, float, float]] = []  # (runs, cost, seconds) of each run group timed
        self.workers = 1

    def work(self, runs: float, cost: float) -> float:
        """The expected seconds, on one worker, of `runs` runs of `cost` in all."""
        a, b = fit(self.points)
        return a * runs + b * cost

    def share(self) -> float:
        return self.work(self.runs_done, self.cost_done) / self.work(self.runs, self.cost) if self.runs else 1.0

    def plan(self, total: int, reused: int, workers: int, timed: list[tuple[int, float, float]] = ()) -> None:
        """The first line: runs in all, reused, to train, on how many workers, and an estimate of the time
        from `timed`, the (runs, cost, seconds) of the reused run groups, as they were trained, where any."""
        self.points = [t for t in timed if t[2] > 0]
        self.workers = max(workers, 1)
        estimate = (f"est. {duration(self.work(self.runs, self.cost) / self.workers)}" if self.points
                    else "an estimate once the first runs end")
        trains = f"{self.runs} to train on {workers} worker{'s' * (workers != 1)} ({estimate})" if self.runs else "0 to train"
        self.say(f"finetune: plan: {total} runs, {reused} reused, {trains}")
        self.start = self.last_line = self.clock()

    def left(self) -> str:
        """The time left, from the rate so far, else the plan's."""
        elapsed = self.clock() - self.start
        if self.cost_done > 0:
            share = self.share()
            return f"about {duration(elapsed / share * (1 - share))} left"
        if self.points:
            return f"about {duration(max(0.0, self.work(self.runs, self.cost) / self.workers - elapsed))} left"
        return f"{duration(elapsed)} in, no run ended yet"

    def line(self) -> None:
        self.say(f"finetune: {int(100 * self.share() + 1e-9)}% of est. time, {self.runs_done}/{self.runs} runs, {self.left()}")
        self.last_line = self.clock()

    def skip(self, runs: int, cost: float, where: str) -> None:
        """Runs the plan counted to train that were found saved after all (by a cluster's other device)."""
        if runs:
            self.runs, self.cost = self.runs - runs, self.cost - cost
            self.say(f"finetune: {runs} more runs reused, saved on {where}: {self.runs} to train")

    def done(self, runs: int, cost: float, seconds: float = 0.0) -> None:
        """`runs` of `cost` just ended, taking `seconds` (0: not measured): a line if they crossed a step of
        STEP, or a minute passed."""
        self.runs_done += runs
        self.cost_done += cost
        if seconds > 0:
            self.points.append((runs, cost, seconds))
        steps = int(self.share() / STEP + 1e-9)
        # a step down too: a refit that finds the small runs slower than their cost said moves the estimate
        if steps != self.steps_said or self.clock() - self.last_line >= HEARTBEAT_S:
            self.steps_said = steps
            self.line()

    def tick(self) -> None:
        """No run ended for a while: a line if a minute passed since the last."""
        if self.clock() - self.last_line >= HEARTBEAT_S:
            self.line()
