"""`xdbert rehearse`: run the untouched paper profile end to end, offline, against a local hub mirror.

The paper profile's code path (hub loaders, bert-base-uncased, ViT-B-32/openai, wiki103, GLUE, SWAG,
CommonLit, COCO) normally runs only on a GPU machine after `xdbert fetch`. A rehearsal runs that same path
on any machine, in minutes, so a loader that cannot read a real layout or a stage that assumes the
embedded profile shows up before the GPU hours are spent:

1. DIR becomes a `git clone` of this checkout, so `dvc repro` runs the committed code;
2. DIR/params.yaml is the paper profile with only the counts of `OVERRIDES` changed (they decide how
   much work a stage does, never what one step computes: no model, tokenizer, rate or loss changes);
3. every hub asset those params name is written into DIR's own hub cache (xdbert.mirror) under its real
   id and a made-up commit, which DIR/hub.lock.json pins, in the real assets' layouts (xdbert.hub_layouts)
   with random weights and generated text; the hand-provided files go to DIR/inputs;
4. `xdbert fetch --check` loads every asset there the way its stage will (xdbert.fetch_check), as a real
   fetch does after its downloads;
5. `dvc repro` runs in DIR with the hub and `datasets` offline and pointed at that cache.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from xdbert import io, numerics, profiles
from xdbert.errors import PipelineError
from xdbert.mirror import build_mirror, check_sizes, write_inputs

# The only values a rehearsal changes in the paper profile: counts of work, each checked in the code that
# reads it to change how much is computed, not what a step computes.
OVERRIDES: dict[str, Any] = {
    "tokenize.workers": 2,              # processes; any number writes the same shards
    "adapt.batch_size": 4,              # windows per optimizer step (the mirror's corpus makes 8)
    "adapt.micro_batch_size": 2,        # windows per forward pass
    "adapt.eval_windows": 8,            # held-out windows scored after adaptation
    "adapt.variants.twenty_epochs.epochs": 2,  # Table 3's 20-epoch row: 2 epochs, still more than the others' 1
    "attention.windows": 4,             # windows the attention analysis averages over
    "attention.batch_size": 2,
    "finetune.seeds": [0],              # one run per model and task instead of the median of 5 (RTE: 9)
    "finetune.rte_seeds": [0],
    "finetune.ablation_seeds": [0],
    "finetune.epochs": 1,
    "finetune.batch_size": 8,
    "finetune.eval_batch_size": 8,
    "aggregate.n_boot": 20,             # bootstrap resamples
    "probes.n_boot": 20,                # the probes' paired bootstrap resamples
}
NOTE = "rehearsal: a count `xdbert rehearse` changes"
CACHE = Path(".hf")  # DIR's HF_HOME; its hub cache is CACHE/hub
REPO = Path(__file__).resolve().parents[1]


def rehearsal_params() -> str:
    """params.yaml text: the paper profile with `OVERRIDES` applied, each marked."""
    return profiles.render("paper", {tuple(k.split(".")): v for k, v in OVERRIDES.items()}, note=NOTE)


def offline_env(out: Path) -> dict[str, str]:
    """The environment `dvc repro` runs in: DIR's code (not an installed copy), DIR's hub cache, no network."""
    cache = (out / CACHE).resolve()
    path = os.pathsep.join(p for p in (str(out.resolve()), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub"),
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def clone(out: Path, say: Callable[[str], None]) -> None:
    """DIR as a clone of this checkout's HEAD; the local mirror stays out of git's view there."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PipelineError(f"{out} exists and is not an empty folder: give a new folder for the rehearsal")
    if not (REPO / ".git").exists():
        raise PipelineError(f"{REPO} is not a git checkout: `xdbert rehearse` clones the project's code from one")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip()
    cloned = subprocess.run(["git", "clone", "--quiet", str(REPO), str(out)], capture_output=True, text=True)
    if cloned.returncode:
        raise PipelineError(f"could not clone the project into {out} ({' '.join(cloned.stderr.split())}): give a folder you can write")
    library = numerics.mkl_library()  # built by the install, not in git: DIR's code would run without it
    if library:
        shutil.copy(library, out / "xdbert")
    with open(out / ".git" / "info" / "exclude", "a", encoding="utf-8") as f:
        f.write(f"/{CACHE}/\n")
    say(f"{out}: clone of {REPO} at {head.stdout.strip()}" + (" (your uncommitted changes are not in it)" if dirty else ""))


def prepare(out: Path, sizes: str, say: Callable[[str], None] = print) -> dict:
    """Clone into `out`, write its params.yaml, hub mirror, hub.lock.json and inputs; the params."""
    from xdbert.params_check import check_file

    check_sizes(sizes)
    clone(out, say)
    io.write_text(out / "params.yaml", rehearsal_params())
    p = check_file(out / "params.yaml")
    entries = build_mirror(p, out / CACHE / "hub", sizes, say)
    io.write_json(out / "hub.lock.json", {
        "profile": p["profile"],
        "rehearsal": f"NOT the hub's commits: an offline mirror with random weights ({sizes} sizes) that `xdbert "
                     f"rehearse` wrote into {CACHE}/hub; this lock lives only in this folder",
        "assets": entries})
    # the hand-provided data stay small at both sizes: `--sizes paper` rehearses loading the models at their
    # size; ViComTe at its own would make the probes stage hours long on a CPU (bench/probes_stage.py times that)
    for path in write_inputs(p, out, "tiny"):
        say(f"{path.relative_to(out)}: rehearsal stand-in, in the real format")
    return p


def check(out: Path, say: Callable[[str], None] = print) -> None:
    """`xdbert fetch --check` in `out` with DIR's code, offline against its mirror, as `dvc repro` will load it."""
    say(f"xdbert fetch --check in {out}")
    done = subprocess.run([sys.executable, "-m", "xdbert.cli", "fetch", "--check"], cwd=out, env=offline_env(out))
    if done.returncode != 0:
        raise PipelineError(f"the mirror in {out} fails `xdbert fetch --check` (exit {done.returncode}): the table above "
                            f"names the asset; the mirror (xdbert.mirror) or a loader no longer matches the real layouts")


def run(out: Path, say: Callable[[str], None] = print) -> list[Path]:
    """`dvc repro` in `out`, offline against its mirror; the reports it wrote."""
    say(f"dvc repro in {out} (offline; hub cache {out / CACHE / 'hub'})")
    done = subprocess.run(["dvc", "repro"], cwd=out, env=offline_env(out))
    if done.returncode != 0:
        raise PipelineError(f"`dvc repro` failed in {out} (exit {done.returncode}): the log above names the stage; "
                            f"fix it and rerun `dvc repro` there with the environment `xdbert rehearse` printed")
    return sorted(p for p in (out / "reports").rglob("*") if p.is_file())


def rehearse(out: Path, sizes: str, repro: bool = True, say: Callable[[str], None] = print) -> list[Path]:
    """The whole rehearsal; the reports (none without `repro`)."""
    prepare(out, sizes, say)
    check(out, say)
    env = offline_env(out)
    say("to rerun by hand: cd " + str(out) + " && " + " ".join(
        f"{k}={env[k]}" for k in ("PYTHONPATH", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                  "TRANSFORMERS_OFFLINE")) + " dvc repro")
    return run(out, say) if repro else []
