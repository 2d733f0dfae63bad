"""Fault injection, counted: kills, damaged inputs and a full disk, on the micro profile.

    python tools/faults.py [--kills 32] [--short] [--seed 0] [--work DIR] [--project DIR] [--report FILE]

1. Builds the pipeline in a fresh git + DVC repository (DIR, default a temporary folder) with the micro
   profile and runs `dvc repro` once, uninterrupted: the reference. Every declared output of dvc.yaml
   (outs, metrics, plots) is hashed. `--project` copies a micro project that has been reproduced already
   (the end-to-end test's) instead, so the reference run only finds it up to date.
2. Kills: for a stage (dual_tokenize, adapt@bert, finetune, aggregate) and a random moment of its
   run (for the stages that write files as they work, every other kill, the first included, comes
   shortly after the run's first such file: a token shard, adaptation's checkpoint, a finished finetuning
   run), `dvc repro --force --single-item STAGE` runs in its own process group, which gets SIGKILL at
   that moment. A finetuning kill's grid trains an eighth of the finished runs again and reuses the rest,
   as after a change of one variant. Then every declared output must be absent or equal to the reference;
   the stage run again (forced, so it computes from its checkpoints instead of being checked out of DVC's
   cache) must bring every output back to the reference's bytes, and `dvc status` must be clean.
3. Damaged inputs: a file is truncated, has a byte flipped, is deleted or holds invalid text, and the
   stage that reads it is run directly. It must exit 2 with one line `error: ...` (no traceback) and
   leave every output as it was; then the file is restored.
4. A full disk: the stage's output folder is a full tmpfs (in a user and mount namespace; without
   `unshare`, a file-size limit makes the writes fail instead). Same checks as 3, inside the full folder.

Prints the counts (faults injected, survived, lost data, unclear errors) and exits 1 if any fault lost
data or gave an unclear error. `--short` is the form CI runs: one kill per stage and a few of the rest.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from xdbert import paths, profiles  # noqa: E402

KILL_STAGES = ("dual_tokenize", "adapt@bert", "finetune", "aggregate")
# What each stage writes as it works: a kill timed from the run's first such file lands in the work, not in
# the imports (a token shard in the folder that replaces data/shards, adaptation's checkpoint, a finished
# finetuning run), and needs no uninterrupted run first to time the stage
PROGRESS = {"dual_tokenize": f"data/.{paths.SHARDS.name}.*.tmp/*/shard-*.arrow",
            "adapt@bert": "checkpoints/adapt/bert/xdbert.pt", "finetune": f".dvc/cache/{paths.RUN_CACHE_NAME}/*.pt"}
RETRAIN_SHARE = 8  # a finetuning kill forgets one finished run in this many: its grid trains them, reuses the rest
RESUMED = re.compile(r"resuming from")  # what adaptation's rerun prints when it picks up the killed run's checkpoint
TRAINED = re.compile(r" runs reused from .*, ([0-9]+) trained$", re.M)  # the grid's rerun, per task
SHORT_DAMAGE = ("truncated task parquet", "flipped byte in an Arrow shard", "missing shard manifest",
                "edited adapt checkpoint")


# ---------------------------------------------------------------- the project and its outputs

def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env_for(cwd))
    if check and r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def env_for(repo: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(repo), "DVC_NO_ANALYTICS": "1"}


def make_project(repo: Path) -> None:
    """The pipeline's code, dvc.yaml and the micro profile's params in a new git + DVC repository."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in paths.PIPELINE_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, repo / name)
    (repo / "params.yaml").write_text(profiles.render("micro", {}))
    (repo / ".gitignore").write_text("/logs/\n/checkpoints/\n")
    sh(["git", "init", "-q", "-b", "main"], repo)
    sh(["dvc", "init", "-q"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=faults", "-c", "user.email=faults@localhost", "commit", "-qm", "micro"], repo)


def declared_outputs(repo: Path) -> dict[str, list[str]]:
    """Stage name -> the paths it declares (outs, metrics, plots), as DVC's own index reads dvc.yaml."""
    from dvc.repo import Repo

    out: dict[str, list[str]] = {}
    with Repo(str(repo)) as r:
        for stage in r.index.stages:
            out[stage.addressing] = [str(Path(o.fs_path).relative_to(repo)) for o in stage.outs]
    return out


def digest(path: Path) -> str | None:
    """sha256 of a file, or of a folder's (relative path, sha256) list; None when absent."""
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def snapshot(repo: Path, outputs: dict[str, list[str]]) -> dict[str, str | None]:
    return {p: digest(repo / p) for paths in outputs.values() for p in paths}


# ---------------------------------------------------------------- the campaign

class Campaign:
    def __init__(self, repo: Path, rng: random.Random):
        self.repo, self.rng = repo, rng
        self.counts = {"injected": 0, "survived": 0, "lost data": 0, "unclear error": 0}
        self.rows: list[dict] = []

    def record(self, kind: str, what: str, problems: list[str], lost: bool, unclear: bool, note: str = "") -> None:
        self.counts["injected"] += 1
        self.counts["lost data"] += lost
        self.counts["unclear error"] += unclear
        self.counts["survived"] += not problems
        self.rows.append({"kind": kind, "fault": what, "ok": not problems, "problems": problems, "note": note})
        print(f"{'ok  ' if not problems else 'FAIL'} {kind}: {what}{' - ' + note if note else ''}"
              + "".join(f"\n     {p}" for p in problems), flush=True)

    def reference(self) -> None:
        t0 = time.time()
        sh(["dvc", "repro"], self.repo)
        self.outputs = declared_outputs(self.repo)
        self.ref = snapshot(self.repo, self.outputs)
        missing = [p for p, d in self.ref.items() if d is None]
        if missing:
            raise SystemExit(f"the reference run did not write {missing}")
        sh(["git", "add", "-A"], self.repo)
        sh(["git", "-c", "user.name=faults", "-c", "user.email=faults@localhost", "commit", "-qm", "reference",
            "--allow-empty"], self.repo)  # a copied --project may hold nothing new
        print(f"reference: dvc repro in {time.time() - t0:.0f} s, {len(self.ref)} declared outputs", flush=True)

    def differences(self, allow_absent: bool) -> list[str]:
        now = snapshot(self.repo, self.outputs)
        return [f"{p}: {'absent' if now[p] is None else 'differs from the uninterrupted run'}"
                for p in self.ref if now[p] != self.ref[p] and not (allow_absent and now[p] is None)]

    # -- kills

    def duration(self, stage: str) -> float:
        t0 = time.time()
        sh(["dvc", "repro", "--force", "--single-item", stage], self.repo)
        seconds = time.time() - t0
        problems = self.differences(allow_absent=False)
        if problems:  # not a fault: the same stage run twice must give the same bytes
            raise SystemExit(f"{stage} rerun uninterrupted gave other bytes: {problems}")
        return seconds

    def forget(self, stage: str) -> None:
        """Remove what the stage's run would resume from or reuse instead of computing: adaptation's
        checkpoint, or one finished finetuning run in RETRAIN_SHARE."""
        old = sorted(self.repo.glob(PROGRESS.get(stage, "-")))
        for path in self.rng.sample(old, -(-len(old) // RETRAIN_SHARE)) if stage == "finetune" else old:
            path.unlink()

    def kill(self, stage: str, seconds: float, after: str = "") -> None:
        """SIGKILL `stage`'s run `seconds` after its start, or, with `after` (a glob), that long after the
        run's first file matching it appears: a kill in the middle of the work, not of the imports."""
        cmd = ["dvc", "repro", "--force", "--single-item", stage]
        self.forget(stage)
        kept = set(self.repo.glob(PROGRESS.get(stage, "-")))
        proc = subprocess.Popen(cmd, cwd=self.repo, env=env_for(self.repo), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while after and proc.poll() is None and not set(self.repo.glob(after)) - kept:
            time.sleep(0.02)
        what = "token shard" if stage == "dual_tokenize" else "checkpoint"
        when = f"{seconds:.1f} s after its first {what}" if after else f"{seconds:.1f} s"
        try:
            proc.wait(timeout=seconds)
            note = f"finished before the kill at {when}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            note = f"killed at {time.time() - t0:.1f} s" + (f", {when}" if after else "")
        saved = len(set(self.repo.glob(PROGRESS.get(stage, "-"))) - kept)  # by the killed run
        problems = [f"after the kill: {p}" for p in self.differences(allow_absent=True)]
        lost = bool(problems)
        # Computed again, resuming from the killed run's checkpoints: a plain `dvc repro` would check the
        # outputs out of DVC's cache ("is cached - skipping run") and test nothing of the stage.
        again = sh(["dvc", "repro", "--force", "--single-item", stage], self.repo, check=False)
        log = again.stdout + again.stderr
        if again.returncode:
            problems.append(f"the rerun failed: {log.strip().splitlines()[-1:]}")
        problems += [f"after the rerun: {p}" for p in self.differences(allow_absent=False)]
        status = sh(["dvc", "status"], self.repo, check=False)
        if "up to date" not in status.stdout + status.stderr:
            problems.append(f"`dvc status` is not clean: {status.stdout.strip()[:300]}")
        lost = lost or bool(problems)
        rerun = ("resumed from its checkpoint" if RESUMED.search(log) else
                 f"trained {sum(map(int, TRAINED.findall(log)))} runs, the killed grid had saved {saved}"
                 if stage == "finetune" else "ran")
        self.record("kill", f"{stage} at {when}", problems, lost, False, f"{note}; the rerun {rerun}")

    # -- damaged inputs and a full disk

    def expect_clear_error(self, kind: str, what: str, cmd: list[str], protected: dict[str, str | None],
                           run=None, problems: list[str] | None = None, lost: bool = False) -> None:
        """Record the fault: one `error:` line and exit 2, no `protected` output changed; `problems` and
        `lost` are what the caller found already."""
        r = (run or (lambda: sh(cmd, self.repo, check=False)))()
        lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        problems, unclear = list(problems or []), False
        if r.returncode != 2 or len(lines) != 1 or "Traceback" in r.stderr:
            unclear = True
            problems.append(f"exit {r.returncode}, {len(lines)} error lines, "
                            f"{'a traceback' if 'Traceback' in r.stderr else 'no traceback'}: {r.stderr.strip()[-400:]}")
        now = snapshot(self.repo, self.outputs)
        changed = [p for p, d in protected.items() if now[p] != d]
        if changed:
            problems.append(f"outputs changed by the failed run: {changed}")
        self.record(kind, what, problems, lost or bool(changed), unclear, lines[0][:160] if lines else "")

    def damage(self, name: str, rel: str, how: str, cmd: list[str], prepare=None) -> None:
        path = self.repo / rel
        if prepare:
            prepare()
        backup = Path(tempfile.mkdtemp()) / "backup"
        if path.is_dir():
            shutil.copytree(path, backup)
        else:
            shutil.copy2(path, backup)
        protected = {p: d for p, d in snapshot(self.repo, self.outputs).items() if not (self.repo / rel).is_relative_to(self.repo / p)}
        data = path.read_bytes() if path.is_file() else b""
        if how == "truncate":
            path.write_bytes(data[:len(data) // 2])
        elif how == "flip":
            at = len(data) // 2
            path.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
        elif how == "delete":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        elif how == "garbage":
            path.write_text("{ this is not what was written here\n")
        self.expect_clear_error("damaged input", f"{name} ({how} {rel})", cmd, protected)
        if path.is_dir():
            shutil.rmtree(path)
        path.unlink(missing_ok=True)
        shutil.move(str(backup), path)
        shutil.rmtree(backup.parent, ignore_errors=True)

    def adapt_checkpoint(self) -> None:
        """A real checkpoint of adapt@bert: the stage killed once its first checkpoint is saved."""
        ckpt = self.repo / "checkpoints/adapt/bert/xdbert.pt"
        proc = subprocess.Popen([sys.executable, "stages/adapt.py", "bert", "xdbert"], cwd=self.repo, env=env_for(self.repo),
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while not ckpt.is_file() and proc.poll() is None and time.time() - t0 < 300:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not ckpt.is_file():
            raise SystemExit("adapt@bert saved no checkpoint to damage")

    def disk_full(self, stage_cmd: list[str], folder: str) -> None:
        """Run `stage_cmd` with `folder` (holding its outputs) on a tmpfs with almost no room left."""
        protected = snapshot(self.repo, self.outputs)
        target = self.repo / folder
        script = f"""set -e
keep=$(mktemp -d); cp -a {target}/. "$keep"/
mount -t tmpfs -o size=$(( $(du -s -B1K "$keep" | cut -f1) + 1024 ))k tmpfs {target}
cp -a "$keep"/. {target}/
cat /dev/zero > {target}/.filler 2>/dev/null || true
set +e
{' '.join(stage_cmd)} 2> "$keep.err"; echo $? > "$keep.rc"
rm -f {target}/.filler
cd {target} && find . -type f -exec sha256sum {{}} + | sort > "$keep.after"
echo "$keep"
"""
        unshare = shutil.which("unshare")
        probe = unshare and subprocess.run([unshare, "-rm", "true"], capture_output=True).returncode == 0
        before = {str(f.relative_to(target)): hashlib.sha256(f.read_bytes()).hexdigest()
                  for f in target.rglob("*") if f.is_file()}
        if probe:
            r = subprocess.run([unshare, "-rm", "bash", "-c", script], cwd=self.repo, env=env_for(self.repo),
                               capture_output=True, text=True)
            keep = Path(r.stdout.strip().splitlines()[-1])
            stderr, rc = Path(f"{keep}.err").read_text(), int(Path(f"{keep}.rc").read_text())
            after = dict(reversed(line.split(maxsplit=1)) for line in Path(f"{keep}.after").read_text().splitlines())
            after = {k.strip()[2:]: v for k, v in after.items()}
            how = "a full tmpfs"
        else:  # no namespaces here: every file may grow to 4 KiB only, so writes fail as on a full disk
            def limited():
                import resource
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
            r = subprocess.run(stage_cmd, cwd=self.repo, env=env_for(self.repo), capture_output=True, text=True,
                               preexec_fn=limited)
            stderr, rc = r.stderr, r.returncode
            after = {str(f.relative_to(target)): hashlib.sha256(f.read_bytes()).hexdigest()
                     for f in target.rglob("*") if f.is_file()}
            how = "a 4 KiB file-size limit"
        lost = [k for k, v in before.items() if after.get(k) != v]
        leftovers = [k for k in after if k not in before]
        found = [f"files lost or changed in {folder}: {lost}"] * bool(lost) + \
                [f"partial files left in {folder}: {leftovers}"] * bool(leftovers)
        result = subprocess.CompletedProcess(stage_cmd, rc, "", stderr)
        self.expect_clear_error("full disk", f"{' '.join(stage_cmd[1:])} writing into {folder} on {how}", stage_cmd,
                                {p: protected[p] for p in protected if not (self.repo / p).is_relative_to(target)},
                                run=lambda: result, problems=found, lost=bool(lost))


DAMAGE = [  # name, path, how, the stage that reads it
    ("truncated task parquet", "data/tasks/rte/train.parquet", "truncate", ["stages/finetune.py"]),
    ("flipped byte in a task parquet", "data/tasks/mrpc/dev.parquet", "flip", ["stages/finetune.py"]),
    ("flipped byte in an Arrow shard", "data/shards/train/shard-00000.arrow", "flip", ["stages/adapt.py", "bert", "mlm"]),
    ("missing shard manifest", "data/shards/manifest.json", "delete", ["stages/adapt.py", "bert", "mlm"]),
    ("edited adapt checkpoint", "checkpoints/adapt/bert/xdbert.pt", "flip", ["stages/adapt.py", "bert", "xdbert"]),
    ("truncated adapt checkpoint", "checkpoints/adapt/bert/xdbert.pt", "truncate", ["stages/adapt.py", "bert", "xdbert"]),
    ("truncated corpus", "data/corpus/train.parquet", "truncate", ["stages/dual_tokenize.py"]),
    ("missing tokenizer", "models/tokenizer/tokenizer.json", "delete", ["stages/adapt.py", "bert", "mlm"]),
    ("invalid encoder config", "models/pretrain_encoder/bert/config.json", "garbage", ["stages/adapt.py", "bert", "mlm"]),
    ("truncated adapted weights", "models/adapted/bert/mlm/model.safetensors", "truncate", ["stages/finetune.py"]),
    ("invalid adaptation metrics", "metrics/adapt/bert/mlm_match.json", "garbage", ["stages/aggregate.py"]),
    ("truncated predictions", "results/finetune/rte/bert/mlm/predictions.parquet", "truncate", ["stages/aggregate.py"]),
    ("invalid params.yaml", "params.yaml", "garbage", ["stages/aggregate.py"]),
    ("missing adaptation metrics", "metrics/adapt/bert/mlm.json", "delete", ["stages/aggregate.py"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=32, help="kills in all, spread over the stages")
    ap.add_argument("--short", action="store_true", help="CI's form: one kill per stage, four damaged inputs, one full disk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, help="where the micro project goes (default: a temporary folder)")
    ap.add_argument("--project", type=Path, help="a micro-profile git + DVC project to copy instead of making one")
    ap.add_argument("--report", type=Path, help="also write the counts and every fault as JSON here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="xdbert-faults-"))
    repo = work / "micro"
    if repo.exists():
        shutil.rmtree(repo)
    if args.project:  # DVC's own state (locks, index) stays behind: the copy builds its own
        shutil.copytree(args.project, repo, symlinks=True, ignore=lambda d, names: ["tmp"] if Path(d).name == ".dvc" else [])
    else:
        make_project(repo)
    c = Campaign(repo, rng)
    c.reference()
    py = sys.executable
    kills = len(KILL_STAGES) if args.short else args.kills
    for i, stage in enumerate(KILL_STAGES):
        n = kills // len(KILL_STAGES) + (i < kills % len(KILL_STAGES))
        seconds = None  # the stage's uninterrupted time, measured once a kill needs it
        for k in range(n):
            if k % 2 == 0 and stage in PROGRESS:  # every other kill, the first, lands in the work it times
                c.kill(stage, rng.uniform(0.0, 0.5), after=PROGRESS[stage])
            else:  # timings vary: keep most kills inside the run
                seconds = seconds or c.duration(stage)
                c.kill(stage, rng.uniform(0.05, 0.8) * seconds)
    for name, rel, how, cmd in DAMAGE:
        if args.short and name not in SHORT_DAMAGE:
            continue
        prepare = c.adapt_checkpoint if "checkpoint" in name else None
        c.damage(name, rel, how, [py, *cmd], prepare)
    (repo / "checkpoints").exists() and shutil.rmtree(repo / "checkpoints")
    c.disk_full([py, "stages/aggregate.py"], "reports")
    if not args.short:  # the folder that holds results/finetune and its atomic write's temporary one
        c.disk_full([py, "stages/finetune.py"], "results")
    final = c.differences(allow_absent=False)
    if final:
        print(f"after the campaign the outputs differ from the reference: {final}")
        c.counts["lost data"] += 1
    print("\n" + json.dumps(c.counts))
    if args.report:
        args.report.write_text(json.dumps({"counts": c.counts, "faults": c.rows}, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if c.counts["lost data"] or c.counts["unclear error"] else 0)


if __name__ == "__main__":
    main()
