"""Which runs the study makes on a task, and where each run's model lives.

A run finetunes one model on one task for every seed. Three kinds of model are finetuned:
- `encoder`: an adapted language encoder, models/adapted/<family>/<name> (Table 1: every family's MLM
  baseline and XDBERT; Table 3: the ablation variants of `adapt.family`, on `finetune.ablation_tasks` only);
- `full`: a family's whole cross-modal model, models/crossmodal/<family>/<name> (Table 8);
- `clip`: a CLIP text tower alone, models/pretrain_<model> (Table 1's CLIP-T row, model `clip`, on
  `finetune.clip_tasks`; the mechanism study's twin tower, model `clip_nofacts`).
A run's results folder is named after its family and model: `<family>/<name>`, `<family>/full_<name>`, or
`<model>_t` for a CLIP run (`clip_t`, `clip_nofacts_t`).

The mechanism study (`mechanism.enabled`) adds its rows of `adapt.family` on the probe task `vis` (they alone)
and on `mechanism.control_task`, under Table 1's protocol (`Study.mechanism_runs`).

Table 3 has a protocol of its own (`finetune.ablation_lr`, `finetune.ablation_seeds`): the paper ran every
ablation at lr 1e-4, CoLA included (Table 1's CoLA rate is 2e-5), with 5 runs, RTE included (Table 1's RTE
has 9 here). When it is set, Table 3's rows of Table 1's models are runs of their own under it, named
`<family>/table3_<name>`; when it is not (null, null), Table 3 reuses Table 1's runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from xdbert import io, params, paths
from xdbert.data.tasks.registry import VIS_SPEC
from xdbert.errors import PipelineError
from xdbert.model.files import CLIP_CONFIG, CROSSMODAL_CONFIG
from xdbert.model.families import ablation_family, family_names


@dataclass(frozen=True)
class ModelFolder:
    """Where the study keeps the models of one kind, and how their runs are named."""

    folder: Callable[[str, str], Path]   # (family, model name) -> its folder
    shown: str                           # the folder as an error message names it
    required: str                        # the file a complete folder has
    run_name: str                        # the run's results folder, `{}` standing for the model name


TOWER_PREFIX = "pretrain_"           # a tower's model name is its folder's without it: clip, clip_nofacts


def clip_model(tower: str) -> str:
    """The model name of a CLIP tower's run (its folder under models/, of `paths.CLIP_TOWERS`)."""
    return tower.removeprefix(TOWER_PREFIX)


def clip_tower(model: str) -> Path:
    """The folder of the CLIP tower a `clip` run of `model` finetunes."""
    return paths.PRETRAIN_CLIP.parent / (TOWER_PREFIX + model)


MODEL_FOLDERS: dict[str, ModelFolder] = {
    "encoder": ModelFolder(paths.adapted, str(paths.adapted("<family>", "<name>")), "config.json", "{}"),
    "clip": ModelFolder(lambda family, name: clip_tower(name), str(clip_tower("<model>")), CLIP_CONFIG, "{}_t"),
    "full": ModelFolder(paths.crossmodal, str(paths.crossmodal("<family>", "<name>")), CROSSMODAL_CONFIG, "full_{}"),
}
MODEL_KINDS = tuple(MODEL_FOLDERS)   # what `prepare.prepare` can finetune
CLIP_MODEL = "clip"                  # the model name of Table 1's `clip` run (models/pretrain_clip)

VIS = VIS_SPEC.name        # the mechanism study's probe task (`mechanism.VIS`)
TABLE3_PREFIX = "table3_"  # the run of a Table 1 model under Table 3's own protocol
TABLE1_PREFIX = "table1_"  # the run of an ablation variant under Table 1's protocol (the mechanism study's rows)


def seed_list(section: dict, key: str, where: str) -> list[int]:
    """`<where>.<key>`: a non-empty list of distinct integer seeds, none negative (numpy refuses those)."""
    chosen = params.get(section, key, where)
    if not isinstance(chosen, list) or not chosen:
        raise PipelineError(f"`{where}.{key}` must be a non-empty list of integer seeds; got {chosen!r}")
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in chosen) or len(set(chosen)) != len(chosen):
        raise PipelineError(f"`{where}.{key}` must list distinct integers >= 0; got {chosen!r}")
    return chosen


@dataclass(frozen=True)
class AblationProtocol:
    """How Table 3's runs are finetuned: one rate for every task and model size, and one seed list for every
    task. None: Table 1's rate of the task, or its seeds."""

    lr: float | None
    seeds: list[int] | None

    @classmethod
    def from_params(cls, finetune: dict) -> AblationProtocol:
        lr = params.get(finetune, "ablation_lr", "finetune")
        if lr is not None:
            lr = params.positive(lr, "finetune.ablation_lr", float)
        seeds = None
        if params.get(finetune, "ablation_seeds", "finetune") is not None:
            seeds = seed_list(finetune, "ablation_seeds", "finetune")
        return cls(lr, seeds)

    @property
    def own(self) -> bool:
        """Whether Table 3 runs under a protocol of its own, not on Table 1's runs."""
        return self.lr is not None or self.seeds is not None


def run_name(model_kind: str, model: str, family: str = "") -> str:
    """The results folder of the run that finetunes `model` of `family` (results/finetune/<task>/<run name>)."""
    name = MODEL_FOLDERS[model_kind].run_name.format(model)
    return f"{family}/{name}" if family and model_kind != "clip" else name


class Run(NamedTuple):
    """One run of a task: (model kind, model name, run name, protocol: "table1" or "ablation", family)."""

    model_kind: str
    model: str
    name: str
    protocol: str = "table1"
    family: str = ""

    @property
    def model_dir(self) -> Path:
        return MODEL_FOLDERS[self.model_kind].folder(self.family, self.model)


@dataclass(frozen=True)
class Study:
    """The models the study finetunes: the run lists of the `finetune` section, for every family."""

    models: list[str]           # Table 1: every family's adapted encoders finetuned on every task
    ablations: list[str]        # Table 3: `ablation_family`'s adapted encoders finetuned on `ablation_tasks`
    ablation_tasks: list[str]
    full_models: list[str]      # Table 8: every family's whole cross-modal models finetuned on every task
    clip_tasks: list[str]       # Table 1's CLIP-T row
    protocol: AblationProtocol  # how Table 3's runs are finetuned
    families: list[str]         # `families`: Table 1's encoders
    ablation_family: str        # `adapt.family`: Table 3's and the mechanism study's
    # The mechanism study's `MechanismSettings` where it is on (its rows on `vis` and its control task), else None.
    # Passed in by the stages that finetune or report them, not imported: the modules that import this one (the
    # grid, the tables) must not follow the study's world generators.
    mechanism: object | None = None

    @classmethod
    def from_params(cls, p: dict, mechanism=None) -> Study:
        """The run lists of the `finetune` section and the study's families, checked. Table 1's and Table 8's
        models are adapted by every family, so they can only be its own two (`baseline`, `xdbert`).
        `mechanism`: `MechanismSettings.from_params(p)`, whose rows join the study where it is enabled."""
        f = params.section(p, "finetune")
        lists = {key: params.names(params.get(f, key, "finetune"), f"finetune.{key}") for key in ("models", "ablations", "ablation_tasks", "full_models", "clip_tasks")}
        for key, allowed in (("models", (params.BASELINE, params.PROPOSED)), ("full_models", (params.PROPOSED,))):
            for name in lists[key]:
                if name not in allowed:
                    raise PipelineError(f"`finetune.{key}` names {name!r}; every family adapts only {', '.join(allowed)}"
                                        f"{'' if key == 'models' else ' with a cross-modal model'}: an ablation variant "
                                        f"belongs in `finetune.ablations` (Table 3)")
        adapted = [params.BASELINE, params.PROPOSED, *params.variant_names(p)]
        for name in lists["ablations"]:  # a typo would otherwise ask for a model folder no stage writes
            if name not in adapted:
                raise PipelineError(f"`finetune.ablations` names {name!r}, which is not an adapt variant or baseline; "
                                    f"allowed: {', '.join(adapted)}")
        both = [name for name in lists["ablations"] if name in lists["models"]]
        if both:  # the same run twice, in one results folder: Table 3's protocol would overwrite Table 1's run
            raise PipelineError(f"`finetune.ablations` names {', '.join(both)}, already Table 1's runs in `finetune.models` "
                                f"(Table 3 shows them anyway, rerun under its own protocol where it has one): list "
                                f"ablation variants only")
        return cls(**lists, protocol=AblationProtocol.from_params(f), families=family_names(p),
                   ablation_family=ablation_family(p).name, mechanism=mechanism if mechanism and mechanism.enabled else None)

    def table3_runs(self) -> dict[str, str]:
        """Table 3's rows: model name -> the run that finetuned it under Table 3's protocol."""
        fam = self.ablation_family
        own = TABLE3_PREFIX if self.protocol.own else ""
        return {**{m: run_name("encoder", own + m, fam) for m in self.models},
                **{m: run_name("encoder", m, fam) for m in self.ablations}}

    def runs(self, task: str) -> list[Run]:
        """Every run the study makes on task `task`, in the order their results are written: Table 1's, 3's and
        8's, then the mechanism study's rows that no run of those is (on `vis`: those alone)."""
        if self.mechanism and task == VIS:
            return list(self.mechanism_runs(task).values())
        out = self._table_runs(task)
        if self.mechanism and task == self.mechanism.control_task:
            names = {r.name for r in out}
            out += [r for r in self.mechanism_runs(task).values() if r.name not in names]
        return out

    def mechanism_runs(self, task: str) -> dict[str, Run]:
        """The mechanism study's rows on `task` (`vis` or `mechanism.control_task`): row label -> the run whose
        results hold it. Labels: the model name of each encoder of `mechanism.models`, `full_<name>` of each of
        `mechanism.full_models`, and `clip_t`, `clip_nofacts_t` of the towers in `mechanism.clip_towers`; every
        run of `adapt.family`.

        Every row is finetuned under Table 1's protocol (`finetune.seeds`, the task's rate), so the rows of one
        task compare. On the control task a row Table 1, 3 or 8 already runs under that protocol is that run,
        reused; an ablation variant that Table 3 runs there under a protocol of its own (`finetune.ablation_lr`
        or `ablation_seeds` set, the task in `ablation_tasks`) gets a run of its own under Table 1's,
        `<family>/table1_<name>`.
        """
        m = self.mechanism
        if m is None or task not in (VIS, m.control_task):
            raise PipelineError(f"task {task!r} has no mechanism study rows: they are on {VIS} and `mechanism.control_task` "
                                f"with `mechanism.enabled: true`")
        fam = self.ablation_family
        ablation = {r.name for r in self._table_runs(task) if r.protocol == "ablation"} if task != VIS else set()
        rows = {}
        for name in m.models:
            run = run_name("encoder", name, fam)
            if run in ablation:  # Table 3's run of it is under another protocol: not comparable with the other rows
                run = run_name("encoder", TABLE1_PREFIX + name, fam)
            rows[name] = Run("encoder", name, run, family=fam)
        for name in m.full_models:
            rows[run_name("full", name)] = Run("full", name, run_name("full", name, fam), family=fam)
        for tower in m.clip_towers:
            model = clip_model(tower)
            rows[run_name("clip", model)] = Run("clip", model, run_name("clip", model))
        return rows

    def _table_runs(self, task: str) -> list[Run]:
        """The runs of Tables 1, 3 and 8 on task `task`."""
        out = []
        for fam in self.families:
            out += [Run("encoder", m, run_name("encoder", m, fam), family=fam) for m in self.models]
            if fam == self.ablation_family and task in self.ablation_tasks:
                protocol = "ablation" if self.protocol.own else "table1"
                if self.protocol.own:  # Table 3's rows of Table 1's models, rerun under its protocol
                    out += [Run("encoder", m, run_name("encoder", TABLE3_PREFIX + m, fam), protocol, fam) for m in self.models]
                out += [Run("encoder", m, run_name("encoder", m, fam), protocol, fam) for m in self.ablations]
            out += [Run("full", m, run_name("full", m, fam), family=fam) for m in self.full_models]
        if task in self.clip_tasks:
            out.append(Run("clip", CLIP_MODEL, run_name("clip", CLIP_MODEL)))
        return out


def check_model_folders(runs: list[Run], tokenizer_dir: Path) -> None:
    """Every run's model folder is complete, and the BERT tokenizer is there when a `full` run needs it."""
    for run in runs:
        where = MODEL_FOLDERS[run.model_kind]
        if not (run.model_dir / where.required).is_file():
            raise PipelineError(f"model folder {run.model_dir} is missing or has no {where.required}: run the stage that "
                                f"writes it (`dvc repro`); a `{run.model_kind}` model lives in {where.shown}")
        for weights in sorted(run.model_dir.glob("*.safetensors")):
            io.check_safetensors(weights)  # before any training
    if any(run.model_kind == "full" for run in runs) and not any(Path(tokenizer_dir).glob("*.json")):
        raise PipelineError(f"missing BERT tokenizer {tokenizer_dir}: run `dvc repro dual_tokenize`")
