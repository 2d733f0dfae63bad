"""Every path a stage reads or writes, in one place; `dvc.yaml` names the same paths.

Each stage's outputs carry the stage's name where the stage has one output of its own
(`models/pretrain_clip`, `results/finetune`, `metrics/<stage>.json`); a stage per family or variant
puts its name in the path (`models/adapted/<family>/<variant>`).
Checkpoints live outside DVC's outputs, so `dvc repro` does not delete them before a killed stage resumes.
"""
from __future__ import annotations

import os
from pathlib import Path

# stage `corpus`
CORPUS = Path("data/corpus")
# stage `tasks`
TASKS = Path("data/tasks")
# stage `dual_tokenize`
SHARDS = Path("data/shards")
TOKENIZER = Path("models/tokenizer")
# stages `pretrain_encoder@<family>`
PRETRAIN_ENCODER = Path("models/pretrain_encoder")            # /<family>
PRETRAIN_ENCODER_METRICS = Path("metrics/pretrain_encoder")   # /<family>.json
# stage `captions`
CAPTIONS = Path("data/captions")          # captions.json (COCO's layout), captions_nofacts.json, facts.json, word_counts.json
CAPTIONS_JSON = CAPTIONS / "captions.json"  # the captions, whatever `grounding.captions` names: `adapt.text: captions` reads it
CAPTIONS_NOFACTS_JSON = CAPTIONS / "captions_nofacts.json"  # the mechanism study's twin captions (`text: captions_nofacts`)
# stage `pretrain_clip`
MODELS = Path("models")
PRETRAIN_CLIP = Path("models/pretrain_clip")
PRETRAIN_CLIP_NOFACTS = Path("models/pretrain_clip_nofacts")  # the mechanism study's twin tower
CLIP_TOWERS = (PRETRAIN_CLIP.name, PRETRAIN_CLIP_NOFACTS.name)  # what `adapt.clip_tower` may name under models/
PRETRAIN_CLIP_METRICS = Path("metrics/pretrain_clip.json")
# stages `adapt_baseline@<family>`, `adapt@<family>` and `ablate@<variant>`
ADAPTED = Path("models/adapted")          # /<family>/<variant>: the language encoder alone
CROSSMODAL = Path("models/crossmodal")    # /<family>/<variant>: the whole cross-modal model
ADAPT_METRICS = Path("metrics/adapt")     # /<family>/<variant>.json
ADAPT_PLOTS = Path("dvclive/adapt")       # /<family>/<variant>
# stage `finetune`
FINETUNE = Path("results/finetune")       # /<task>/<family>/<run>, /<task>/clip_t
PREDICTIONS = "predictions.parquet"       # a run's dev predictions, beside its metrics.json
# stage `aggregate`
REPORTS = Path("reports")
AGGREGATE_JSON = Path("results/aggregate.json")
AGGREGATE_CSV = Path("results/aggregate.csv")
TABLES_METRICS = Path("metrics/tables.json")   # every cell of Tables 1, 3 and 8, for `dvc metrics diff --targets`
HEADLINE = Path("metrics/headline.json")       # what `xdbert compare` (dvc exp show) puts side by side
# stage `pwcca`
PWCCA_METRICS = Path("results/pwcca.json")
# stage `grounding`
GROUNDING_METRICS = Path("results/grounding.json")
FIGURE4 = Path("reports/figure4.png")     # beside report("figure4")
# stage `mechanism`
MECHANISM_METRICS = Path("results/mechanism.json")   # beside report("mechanism")
VIS_KINDS = "dev_kinds.parquet"           # data/tasks/vis/<this> (stage `tasks`): each dev example's kind and object
# stage `probes`
PROBES_METRICS = Path("results/probes.json")   # beside report("probes")
# stage `attention`
ATTENTION = Path("reports/attention")
ATTENTION_METRICS = Path("results/attention.json")

# What a copy of the pipeline needs besides params.yaml (the end-to-end test and the fault campaign make one)
PIPELINE_FILES = ("dvc.yaml", "hub.lock.json", "inputs", "stages", "xdbert")

# Resumable training state, outside every stage's outputs.
CHECKPOINTS = Path("checkpoints")
PRETRAIN_CLIP_CHECKPOINT = CHECKPOINTS / "pretrain_clip.pt"
PRETRAIN_CLIP_NOFACTS_CHECKPOINT = CHECKPOINTS / "pretrain_clip_nofacts.pt"
# Finished finetuning runs, /<key>.pt by what decided them (`run_cache`)
RUN_CACHE_ENV = "XDBERT_RUN_CACHE"        # a folder that overrides where they live
RUN_CACHE_NAME = "xdbert-runs"            # their folder in DVC's cache
LOCAL_RUN_CACHE = CHECKPOINTS / "runs"    # their folder in a project that is no DVC repository
# Wall-clock times and the machine of each run (xdbert.runlog), outside every stage's outputs.
RUN_LOG = Path("logs")


def run_cache() -> Path:
    """Where finished finetuning runs are kept: `XDBERT_RUN_CACHE`, else xdbert-runs/ in DVC's cache.

    A queued or `--temp` experiment runs in a copy of the repository under .dvc/tmp/exps/ without its
    git-ignored files, checkpoints/ among them; DVC points that copy's cache at the repository's own
    (`cache.dir` in its .dvc/config.local), so every experiment of the repository, the workspace's too,
    reads and adds runs in the same folder. DVC's `gc` leaves it alone: it only reads folders of its own
    two-character names there. A folder that is no DVC repository (a stage run by hand) keeps them in
    checkpoints/runs."""
    if os.environ.get(RUN_CACHE_ENV):
        return Path(os.environ[RUN_CACHE_ENV])
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        with Repo() as repo:
            return Path(repo.cache.local_cache_dir) / RUN_CACHE_NAME
    except NotDvcRepoError:
        return LOCAL_RUN_CACHE


def pretrain_encoder(family: str) -> Path:
    return PRETRAIN_ENCODER / family


def pretrain_encoder_checkpoint(family: str) -> Path:
    return CHECKPOINTS / "pretrain_encoder" / f"{family}.pt"


def adapt_checkpoint(family: str, variant: str) -> Path:
    return CHECKPOINTS / "adapt" / family / f"{variant}.pt"


def predictions(task: str, run: str, root: Path = FINETUNE) -> Path:
    """The dev predictions of run `run` on `task` (`root`: the finetune stage's results folder)."""
    return Path(root) / task / run / PREDICTIONS


def adapted(family: str, variant: str) -> Path:
    return ADAPTED / family / variant


def crossmodal(family: str, variant: str) -> Path:
    return CROSSMODAL / family / variant


def report(name: str) -> Path:
    """reports/<name>.md: table1, table2, table3, table6, table8, figure4, attention, mechanism."""
    return REPORTS / f"{name}.md"

