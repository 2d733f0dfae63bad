"""The grid's log (xdbert.finetuning.control.progress) and its score (tools/score_eta.py).

The estimate of the time left is checked on grids replayed with a fake clock: the workers take the runs in
the grid's order, each run takes its time and a little outside it that the estimator is not told, and the
log's lines are scored as a real log would be. Profiles: the embedded profile's grid as a repro measured it
(fresh, and partly reused after a change that retrains most runs, its reused runs timed at another pace),
and a GPU-like grid of few, long runs on 8 workers whose first run on each worker pays a long start.
"""
from __future__ import annotations

import heapq
import math
import random
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from xdbert.errors import PipelineError
from xdbert.finetuning.control import progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import score_eta  # noqa: E402

# The embedded profile's grid, as a fresh repro's run log measured it (2 workers, 2 cores, 2026-12-06):
# (task, kind, runs, cost in 1e9 units, mean seconds of a run). A cost model cannot tell these apart: the
# encoder runs of rte take 3.5 s at a cost of 22, those of swag 15 s at 122, CLIP-T's of rte 5.4 s at 101.
EMBEDDED = [
    ("swag", "full", 5, 4690, 62.45), ("qnli", "full", 5, 2330, 40.12), ("rte", "full", 9, 621, 13.97),
    ("mrpc", "full", 5, 607, 12.61), ("mnli", "full", 5, 601, 12.21), ("stsb", "full", 5, 594, 8.93),
    ("qqp", "full", 5, 583, 8.52), ("read", "full", 5, 534, 40.21), ("vis", "full", 10, 470, 8.84),
    ("sst2", "full", 10, 296, 6.48), ("cola", "full", 5, 295, 5.54), ("swag", "encoder", 10, 122, 15.31),
    ("rte", "clip", 9, 101, 5.43), ("mrpc", "clip", 5, 101.1, 3.49), ("stsb", "clip", 5, 101.2, 2.99),
    ("vis", "clip", 10, 80.7, 2.48), ("qnli", "encoder", 10, 58.7, 9.41), ("read", "encoder", 10, 56.6, 8.31),
    ("cola", "clip", 5, 50.4, 1.69), ("sst2", "clip", 10, 50.41, 2.14), ("rte", "encoder", 72, 22.4, 3.54),
    ("mrpc", "encoder", 40, 19.5, 3.11), ("mnli", "encoder", 10, 18.3, 3.07), ("stsb", "encoder", 40, 16.8, 2.66),
    ("qqp", "encoder", 10, 14.6, 2.57), ("vis", "encoder", 45, 12.5, 2.29), ("sst2", "encoder", 45, 8.3, 1.50),
    ("cola", "encoder", 40, 8.02, 1.65),
]


def gpu_like() -> list[tuple[str, str, int, float, float]]:
    """A made-up grid of another shape, on GPUs: the study's 13 models (10 encoders, 2 CLIP-T, 1 full) on 7
    tasks of 2,500 to 400,000 examples, 5 seeds each. A run takes a fixed time (loading, compiling,
    evaluating) and a time per example, each kind its own."""
    sizes = {"rte": 2.5, "mrpc": 3.7, "stsb": 5.7, "cola": 8.5, "sst2": 67, "qnli": 105, "mnli": 393}
    kinds = {"encoder": (10, 1.0, 20.0, 1.0), "clip": (2, 1.0, 10.0, 0.4), "full": (1, 4.0, 40.0, 3.0)}
    return [(task, kind, 5 * models, per_example * size, fixed + seconds * size) for task, size in sizes.items()
            for kind, (models, per_example, fixed, seconds) in kinds.items()]


# A change of the facts seed (seed 100's repro, then seed 0's): the run cache gives back the runs of the two
# encoders no fact reaches (baseline and placeholder: these counts of each task's encoder runs); every
# other encoder, every CLIP-T and full run, and all of `vis` train again.
FACTS_CHANGED = {"cola": 10, "mnli": 5, "mrpc": 10, "qnli": 5, "qqp": 5, "read": 5, "rte": 18, "sst2": 10,
                 "stsb": 10, "swag": 5}


def replay(classes, workers: int, outside: float = 0.3, warm: float = 0.0, reused: float | dict = 0.0,
           pace_before: float = 1.0, seed: int = 0) -> list[str]:
    """The log of a grid of `classes` on `workers`: each run takes its class's seconds (a 12% spread),
    plus `outside` seconds its result does not record; a worker's first run `warm` more. A share `reused`
    of each class's runs (or, as a dict, that many of each task's encoder runs) comes from the run cache,
    recorded at `pace_before` times the pace of today's."""
    rng = random.Random(seed)
    runs, timed = [], []
    for task, kind, n, cost, seconds in classes:
        kept = (reused.get(task, 0) if kind == "encoder" else 0) if isinstance(reused, dict) else round(reused * n)
        for i in range(n):
            taken = seconds * rng.lognormvariate(0, 0.12)
            if i < kept:
                timed.append((kind, cost, taken * pace_before))
            else:
                runs.append(((task, kind, i), cost, taken))
    runs.sort(key=lambda run: -run[1])
    order = progress.probing_order(runs, workers, kind=lambda run: run[0][1])
    now, said = [0.0], []
    log = progress.Progress(say=said.append, clock=lambda: now[0])
    log.plan(total=len(runs) + len(timed), reused=len(timed), workers=workers,
             order=[(key, 1, cost, key[1]) for key, cost, _ in order], timed=timed)
    now[0] = 3.0  # the workers start
    log.start_runs()
    queue, ends = deque(order), []

    def take(first: bool) -> None:
        if queue:
            key, _, taken = queue.popleft()
            recorded = taken + warm * first
            heapq.heappush(ends, (now[0] + recorded + outside, key, recorded))

    for _ in range(workers):
        take(first=True)
    while ends:
        end, key, recorded = heapq.heappop(ends)
        while now[0] + progress.TICK_S < end:  # the engine's ticks while no run ends
            now[0] += progress.TICK_S
            log.tick()
        now[0] = end
        take(first=False)
        log.done(key, recorded)
    return said


PROFILES = {
    "embedded, fresh": dict(classes=EMBEDDED, workers=2),
    "embedded, 25% reused, timed 1.6x slower": dict(classes=EMBEDDED, workers=2, reused=0.25, pace_before=1.6),
    "embedded, 25% reused, timed 0.6x as long": dict(classes=EMBEDDED, workers=2, reused=0.25, pace_before=0.6),
    "embedded, the facts changed: two encoders reused": dict(classes=EMBEDDED, workers=2, reused=FACTS_CHANGED),
    "embedded, the facts changed, timed 1.5x slower": dict(classes=EMBEDDED, workers=2, reused=FACTS_CHANGED,
                                                          pace_before=1.5),
    "embedded, 4 workers, 1 s outside each run": dict(classes=EMBEDDED, workers=4, outside=1.0),
    "gpu-like, 8 workers, 60 s start": dict(classes=gpu_like(), workers=8, outside=2.0, warm=60.0),
    "gpu-like, 8 workers, 40% reused, timed 1.3x slower": dict(classes=gpu_like(), workers=8, outside=2.0, warm=60.0,
                                                              reused=0.4, pace_before=1.3),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("profile", PROFILES)
def test_the_time_left_is_within_a_quarter_from_a_tenth_of_the_grid_on_and_the_share_never_falls(profile, seed):
    """The issue's bar: from 10% of the grid's time on, every line within max(25%, 30 s) of the time
    really left, and the share never falls (the old estimate said 75% after 47 of 445 runs, then 27%)."""
    [grid] = score_eta.grids(replay(**PROFILES[profile], seed=seed))
    result = score_eta.score(grid)
    assert result.scored >= 10 and not result.fell and result.outside == 0, str(result)


def test_probes_start_a_few_runs_of_each_kind_early_each_worker_on_a_cheap_run_first():
    """120 runs, costliest first: 30 of a full model, 90 of encoders, on 3 workers. Each worker starts on
    one of the 3 cheapest; then 23 probes, cheapest first, at even steps from each kind's costliest to
    its cheapest, in proportion to the kinds' other runs (24 x 30 / 120 and 24 x 87 / 120); then the rest. Results do not
    depend on the order, and smaller grids keep theirs."""
    runs = list(range(120))
    order = progress.probing_order(runs, workers=3, kind=lambda run: "full" if run < 30 else "encoder")
    probes = order[3:3 + 23]
    assert order[:3] == [117, 118, 119] and sorted(order) == runs
    assert probes == sorted(probes, reverse=True) and [r for r in probes if r < 30] == [29, 23, 17, 12, 6, 0]
    encoder = [r for r in probes if r >= 30]
    assert len(encoder) == 17 and (encoder[0], encoder[-1]) == (116, 30)
    assert max(a - b for a, b in zip(encoder, encoder[1:])) - min(a - b for a, b in zip(encoder, encoder[1:])) <= 1
    assert order[26:] == [r for r in runs if r not in order[:26]]
    assert progress.probing_order(runs[:95], workers=3) == runs[:95]


def test_a_run_reads_its_time_off_the_measured_runs_of_its_kind_and_about_its_cost():
    """The geometric mean at a measured cost, straight on log-log axes between two, flat below the
    cheapest; above the costliest, the line through the cheapest and the costliest (not falling)."""
    seconds = progress.curve([(10.0, 2.0), (10.0, 8.0), (1000.0, 40.0), (0.0, 5.0)])
    assert seconds(10.0) == pytest.approx(4.0)                        # sqrt(2 x 8)
    assert seconds(100.0) == pytest.approx(math.sqrt(4.0 * 40.0))     # halfway on log axes
    assert seconds(1.0) == pytest.approx(4.0)
    assert seconds(2000.0) == pytest.approx(40.0 + 1000 * 36.0 / 990)
    assert progress.curve([(10.0, 8.0), (1000.0, 4.0)])(2000.0) == pytest.approx(4.0)
    assert progress.curve([(10.0, 5.0)])(40.0) == pytest.approx(20.0)  # one cost: in proportion to it
    assert progress.curve([]) is None
    # A kind: its own runs. A kind measured at one cost: the seconds per cost of all runs beyond it. A kind
    # not measured: all runs.
    of = progress.curves([("encoder", 10.0, 10.0), ("encoder", 100.0, 55.0), ("clip", 10.0, 2.0)])
    assert of("encoder", 10.0) == pytest.approx(10.0) and of("clip", 10.0) == pytest.approx(2.0)
    assert of("clip", 110.0) == pytest.approx(2.0 + 100 * (55.0 - math.sqrt(10.0 * 2.0)) / 90)
    assert of("full", 100.0) == pytest.approx(55.0)
    assert progress.curves([]) is None


def test_lines_say_the_share_the_runs_the_elapsed_time_and_the_time_left():
    """2 workers, 2 runs of cost 100 then 10 of cost 1. No estimate before a run ends; the workers' first
    runs estimate alone (every run as long as 100 s, the cheapest measured) until another run ends; the
    share never falls when an estimate grows; a last line when the last run ends."""
    now, said = [0.0], []
    p = progress.Progress(say=said.append, clock=lambda: now[0])
    order = [("big", 0), ("big", 1)] + [("small", i) for i in range(10)]
    p.plan(total=12, reused=0, workers=2, order=[(key, 1, 100.0 if key[0] == "big" else 1.0, "encoder") for key in order])
    assert said == ["finetune: plan: 12 runs, 0 reused, 12 to train on 2 workers (an estimate once the first runs end)"]
    p.start_runs()
    now[0] = 59
    p.tick()
    assert len(said) == 1
    now[0] = 60
    p.tick()
    assert said[-1] == "finetune: 0% of est. time, 0/12 runs, 0:01:00 elapsed, no run ended yet"
    now[0] = 100
    p.done(("big", 0), 100.0)  # the other big run ends now too; 10 small of 100 s each on 2 workers
    assert said[-1] == "finetune: 16% of est. time, 1/12 runs, 0:01:40 elapsed, about 8 min 20 s left"
    now[0] = 101
    p.done(("big", 1), 100.0)
    now[0] = 110
    p.done(("small", 0), 9.0)  # started at 100: 1 s outside it; 1 in flight till 111, 8 more of 10 s
    assert p.left(now[0]) == pytest.approx(1 + 40)
    assert said[-1] == "finetune: 72% of est. time, 3/12 runs, 0:01:50 elapsed, about 40 s left"
    now[0] = 141
    p.done(("small", 1), 39.0)  # slower: the estimate grows, the share stays
    each = math.sqrt(9.0 * 39.0) + 1  # small 2 is past its time; small 3 and 3 more on one worker
    assert p.left(now[0]) == pytest.approx(4 * each) and p.shown == pytest.approx(110 / 151)
    for i in range(2, 10):
        now[0] += 10
        p.done(("small", i), 9.0)
    assert said[-1] == "finetune: 100% of est. time, 12/12 runs, 0:03:41 elapsed, done"
    shares = [int(line.split("%")[0].split()[-1]) for line in said[1:]]
    assert shares == sorted(shares) and all(progress.LINE.match(line) for line in said[1:])


def test_reused_runs_give_the_plan_its_estimate_at_todays_pace():
    """The reused runs' recorded seconds estimate the plan; once runs trained today show another pace,
    the reused times are scaled to it."""
    now, said = [0.0], []
    p = progress.Progress(say=said.append, clock=lambda: now[0])
    p.plan(total=12, reused=2, workers=1, order=[(i, 1, 1.0, "encoder") for i in range(10)],
           timed=[("encoder", 1.0, 6.0), ("encoder", 100.0, 60.0)])
    assert said[-1] == "finetune: plan: 12 runs, 2 reused, 10 to train on 1 worker (est. 1 min)"  # 10 x 6 s
    p.start_runs()
    for i in range(2):
        now[0] += 12.0
        p.done(i, 12.0)
    assert p.left(now[0]) == pytest.approx(8 * 12.0)  # twice as slow as the reused runs said


def test_the_time_outside_a_run_counts_and_a_workers_first_run_is_set_aside():
    """A worker holds each run 5 s longer than its result records: the time left adds them. A worker's
    first run, 30 s longer for starting the worker, counts only until another run ends."""
    now, said = [0.0], []
    p = progress.Progress(say=said.append, clock=lambda: now[0])
    p.plan(total=6, reused=0, workers=1, order=[(i, 1, 1.0, "encoder") for i in range(6)])
    p.start_runs()
    now[0] = 45.0
    p.done(0, 40.0)  # 30 s of start, 10 s of run, 5 s outside
    assert p.left(now[0]) == pytest.approx(5 * 40.0)
    now[0] += 15.0
    p.done(1, 10.0)
    assert p.left(now[0]) == pytest.approx(4 * 15.0)


def test_a_run_skipped_as_saved_elsewhere_leaves_the_count_and_the_queue():
    said = []
    p = progress.Progress(say=said.append, clock=lambda: 0.0)
    p.plan(total=3, reused=0, workers=1, order=[("a", 2, 5.0, "encoder"), ("b", 1, 1.0, "encoder")])
    p.skip(["a"], "cuda")
    assert said[-1] == "finetune: 2 more runs reused, saved on cuda: 1 to train" and list(p.queue) == ["b"]


def test_durations_read_back_as_they_were_written():
    for seconds in (0, 7, 42, 61, 95, 599, 601, 3599, 3600 + 5 * 60, 36000):  # at least "5 s"
        text = progress.duration(seconds)
        assert abs(progress.seconds_of(text) - seconds) <= max(5, 0.05 * seconds), text
        assert progress.seconds_of(progress.clock(seconds)) == seconds
    assert [progress.duration(s) for s in (0, 42, 95, 601, 3900)] == ["5 s", "40 s", "1 min 40 s", "10 min", "1 h 5 min"]
    with pytest.raises(ValueError, match="no duration"):
        progress.seconds_of("soon")


HAND_MADE = """\
Running stage 'finetune':
finetune rte: tokenized for 10 models
finetune: plan: 100 runs, 0 reused, 100 to train on 2 workers (an estimate once the first runs end)
finetune: 0% of est. time, 0/100 runs, 0:00:05 elapsed, no run ended yet
finetune: 20% of est. time, 10/100 runs, 0:01:40 elapsed, about 7 min left
finetune: 40% of est. time, 30/100 runs, 0:03:20 elapsed, about 5 min left
finetune: 35% of est. time, 40/100 runs, 0:05:00 elapsed, about 3 min 20 s left
finetune: 80% of est. time, 90/100 runs, 0:08:00 elapsed, about 40 s left
finetune: 100% of est. time, 100/100 runs, 0:10:00 elapsed, done
finetune rte: 0 of 100 runs reused from runs, 100 trained
"""


def test_the_scorer_finds_the_worst_estimate_after_a_tenth_and_any_fall():
    """A 600 s grid: lines from 60 s on are scored. At 100 s, 420 s said for 500 s left (-16%, within
    125 s); at 200 s, 300 s for 400 s (off 100 s of a 100 s tolerance: just within); at 300 s, 200 s for
    300 s (100 s off, 75 s allowed: the worst); at 480 s, 40 s for 120 s (80 s off, 30 s allowed)."""
    [grid] = score_eta.grids(HAND_MADE.splitlines())
    result = score_eta.score(grid)
    assert (result.seconds, result.runs, result.scored, result.outside) == (600, 100, 4, 2)
    assert result.worst == pytest.approx(80 / 30) and result.worst_at == 480
    assert (result.worst_said, result.worst_true) == (40, 120)
    assert result.fell == [(300, 40, 35)] and not result.passed
    assert "2 out of tolerance" in str(result) and "fell 1 time(s), first at 0:05:00 from 40% to 35%" in str(result)


def test_the_scorer_refuses_logs_it_cannot_score(tmp_path):
    old = HAND_MADE.replace(", 0:01:40 elapsed", "")
    with pytest.raises(PipelineError, match=r"log:5: .* is no progress line this tool reads"):
        score_eta.grids(old.splitlines())
    with pytest.raises(PipelineError, match="has no last line"):
        score_eta.grids(HAND_MADE.splitlines()[:-2])
    with pytest.raises(PipelineError, match="no grid that trained"):
        score_eta.grids(["finetune: plan: 4 runs, 4 reused, 0 to train"])
    (tmp_path / "repro.log").write_text(old)
    cli = subprocess.run([sys.executable, str(ROOT / "tools" / "score_eta.py"), str(tmp_path / "repro.log")],
                         capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 2 and "is no progress line this tool reads" in cli.stderr
    (tmp_path / "repro.log").write_text(HAND_MADE)
    cli = subprocess.run([sys.executable, str(ROOT / "tools" / "score_eta.py"), str(tmp_path / "repro.log")],
                         capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 1 and "grid 1 (lines 4-9): 100 runs in 0:10:00" in cli.stdout and "FAIL" in cli.stdout
