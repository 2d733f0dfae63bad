"""Stage `mechanism`: do CLIP's facts reach the encoder? The calibration ladder and gates A-E of the mechanism
study (issues 55 and 68): settings read here, every number from xdbert/analysis/mechanism_study.py.

    deps:   models/pretrain_clip, models/pretrain_clip_nofacts (the facts tower and its twin),
            models/pretrain_encoder, models/adapted, models/crossmodal (<adapt.family>/<name>), models/tokenizer,
            data/tasks (vis and the control task), data/corpus, results/finetune
    outs:   reports/mechanism.md, results/mechanism.json (metrics)

With `mechanism.enabled: false` (the paper profile) it writes a short report saying the study is off, and
nothing else. The design: ../shared/MECHANISM.md.
"""
from __future__ import annotations

from xdbert import io
from xdbert import params as P
from xdbert.adaptation.pretrain_settings import PretrainSettings
from xdbert.adaptation.settings import AdaptSettings
from xdbert.analysis.mechanism_study import Plan, check_inputs, missing_rows, replication_claim, study
from xdbert.data.mechanism import CAPTION_MLM, VIS, MechanismSettings
from xdbert.errors import PipelineError
from xdbert.finetuning.control.runs import Study
from xdbert.model.families import ablation_family
from xdbert.paths import MECHANISM_METRICS, report
from xdbert.stage import run


def read(p: dict) -> Plan:
    """Every param this stage reads, checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    s = MechanismSettings.from_params(p)
    family = ablation_family(p).name
    tasks_seed = P.non_negative(P.get(P.section(p, "tasks"), "seed", "tasks"), "tasks.seed")
    study = Study.from_params(p, s) if s.enabled else None
    runs = {task: study.mechanism_runs(task) for task in (VIS, s.control_task)} if s.enabled else {}
    missing = missing_rows(runs[VIS]) if s.enabled else []
    if missing:
        raise PipelineError(f"the mechanism study's gates need the rows {', '.join(missing)}: list them in "
                            f"`mechanism.models`, `mechanism.full_models` (as the name after full_) or "
                            f"`mechanism.clip_towers`")
    clip = PretrainSettings.clip_from_params(p, P.get(P.section(p, "model"), "clip_pretrained", "model"))
    reference = AdaptSettings.from_params(p, CAPTION_MLM) if s.enabled else None
    return Plan(p["profile"], s, family, tasks_seed, runs, None if clip is None else (clip.steps, clip.batch_size),
                (reference.batch_size, reference.attribute_mlm_prob or reference.mlm_prob) if reference else (0, 0.0))


def main() -> None:
    plan = read(P.load())
    s = plan.s
    from xdbert.reports.header import header

    if not s.enabled:
        io.write_json(MECHANISM_METRICS, {"profile": plan.profile, "enabled": False})
        io.write_text(report("mechanism"), header("The mechanism study: do CLIP's facts reach the encoder?",
                                                  plan.profile, "-")
                      + "\nThe study is off (`mechanism.enabled: false`): no gate was run.\n")
        return
    from xdbert.data.tasks.registry import get_task

    control_split = get_task(s.control_task).dev_splits[0]
    check_inputs(plan, control_split)
    replication = replication_claim(s.replication, s.seed)
    result, markdown = study(plan, control_split, replication, header)
    io.write_json(MECHANISM_METRICS, result)
    io.write_text(report("mechanism"), markdown)
    for g in result["gates"].values():
        print(f"mechanism gate {g['name']}: {g['state']}: {g['numbers']}")


if __name__ == "__main__":
    run(main)
