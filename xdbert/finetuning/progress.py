"""The grid's log, readable in a `dvc repro` log: its plan as it starts, then how far it is.

The grid can take hours, and returns only when its last run ends. So it says at once how many runs it
reuses and trains, then prints a line at every 5% of the estimated cost done and at least every minute.
Progress is weighed by each run's expected cost (`grid.cost`), not counted in runs: the longest runs go
first, and the first runs to finish are a larger share of the work than their number. The time left is
the cost left at the rate the finished runs went; before any has finished, at the rate the reused runs
went when they were trained, where the grid reuses any.
"""
from __future__ import annotations

import time
from typing import Callable

STEP = 0.05        # a line at every 5% of the estimated cost done ...
HEARTBEAT_S = 60   # ... and at least every minute,
TICK_S = 1         # looking at the clock this often while no run ends


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


class Progress:
    """Counts the cost and the runs done of a grid's runs to train, and says how far it is."""

    def __init__(self, runs: int, cost: float, say: Callable[[str], None] = say,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runs, self.cost = runs, cost    # to train
        self.runs_done, self.cost_done = 0, 0.0
        self.say, self.clock = say, clock
        self.start = self.last_line = clock()
        self.steps_said = 0                  # of STEP
        self.seconds_per_cost: float | None = None  # the reused runs' rate, before a run of this grid ends

    def plan(self, total: int, reused: int, workers: int, reused_seconds: float = 0.0, reused_cost: float = 0.0) -> None:
        """The first line: runs in all, reused, to train, on how many workers, and an estimate of the time
        from the seconds the reused runs took to train and their cost (one worker each), where any."""
        if self.runs and reused_seconds > 0 and reused_cost > 0:
            self.seconds_per_cost = reused_seconds / reused_cost / workers
        estimate = (f"est. {duration(self.cost * self.seconds_per_cost)}" if self.seconds_per_cost
                    else "an estimate once the first runs end")
        trains = f"{self.runs} to train on {workers} worker{'s' * (workers != 1)} ({estimate})" if self.runs else "0 to train"
        self.say(f"finetune: plan: {total} runs, {reused} reused, {trains}")
        self.start = self.last_line = self.clock()

    def left(self) -> str:
        """The time left, from the rate so far, else the plan's."""
        elapsed = self.clock() - self.start
        if self.cost_done > 0:
            return f"about {duration(elapsed / self.cost_done * (self.cost - self.cost_done))} left"
        if self.seconds_per_cost:
            return f"about {duration(max(0.0, self.cost * self.seconds_per_cost - elapsed))} left"
        return f"{duration(elapsed)} in, no run ended yet"

    def line(self) -> None:
        share = self.cost_done / self.cost if self.cost else 1.0
        self.say(f"finetune: {int(100 * share)}% of est. cost, {self.runs_done}/{self.runs} runs, {self.left()}")
        self.last_line = self.clock()

    def skip(self, runs: int, cost: float, where: str) -> None:
        """Runs the plan counted to train that were found saved after all (by a cluster's other device)."""
        if runs:
            self.runs, self.cost = self.runs - runs, self.cost - cost
            self.say(f"finetune: {runs} more runs reused, saved on {where}: {self.runs} to train")

    def done(self, runs: int, cost: float) -> None:
        """`runs` of `cost` just ended: a line if they crossed a step of STEP, or a minute passed."""
        self.runs_done += runs
        self.cost_done += cost
        steps = int(self.cost_done / self.cost / STEP + 1e-9) if self.cost else 0
        if steps > self.steps_said or self.clock() - self.last_line >= HEARTBEAT_S:
            self.steps_said = steps
            self.line()

    def tick(self) -> None:
        """No run ended for a while: a line if a minute passed since the last."""
        if self.clock() - self.last_line >= HEARTBEAT_S:
            self.line()
