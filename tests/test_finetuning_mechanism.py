"""The mechanism study's rows in the finetuning grid: `vis` and the control task, under Table 1's protocol,
never a run twice, and nothing of it where the study is off (the paper profile) or in Tables 1, 3 and 8."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from xdbert.data.mechanism import VIS, MechanismSettings
from xdbert.data.synthetic.words import PATTERNS
from xdbert.data.tasks.names import task_names
from xdbert.data.tasks.registry import VIS_SPEC, get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.keys import code_files
from xdbert.params_check import check
from xdbert.finetuning.control.runs import Study
from xdbert.finetuning.control.settings import FinetuneSettings
from xdbert.profiles import values
from xdbert.reports.settings import AggregateSettings

ROOT = Path(__file__).resolve().parents[1]
ROWS = {"baseline", "xdbert", "nofacts", "caption_mlm", "caption_mlm_nofacts", "distill_kl", "distill_kl_nofacts",
        "full_xdbert", "full_nofacts", "clip_t", "clip_nofacts_t"}  # micro's: rung T's KL pair alone


def stage_read(p: dict) -> tuple:
    spec = importlib.util.spec_from_file_location("finetune_stage", ROOT / "stages" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read(p)


def study(profile: str) -> Study:
    p = values(profile)
    return Study.from_params(p, MechanismSettings.from_params(p))


def test_vis_spec_names_the_study_s_task_and_words():
    """The registry writes them out (see VIS_SPEC's comment): they must stay the mechanism module's."""
    assert VIS_SPEC.name == VIS and VIS_SPEC.label_names == tuple(PATTERNS) and get_task(VIS) is VIS_SPEC


def test_the_stage_finetunes_vis_with_its_rate_when_the_study_is_on():
    _, _, settings = stage_read(values("embedded"))
    assert [s.task.name for s in settings] == [*task_names(values("embedded")), "vis"]
    vis = settings[-1]
    assert vis.hyperparameters("base", "encoder").lr == 1e-3 and vis.seeds == [0, 1, 2, 3, 4]
    assert [r.name for r in vis.study.runs("vis")] == [
        "bert/baseline", "bert/xdbert", "bert/nofacts", "bert/mlm_match", "bert/mlm", "bert/one_cross", "bert/two_epochs",
        "bert/placeholder", "bert/caption_mlm", "bert/caption_mlm_nofacts", "bert/distill_kl", "bert/distill_kl_nofacts",
        "bert/distill_cos", "bert/distill_cos_nofacts", "bert/full_xdbert", "bert/full_nofacts", "clip_t", "clip_nofacts_t"]


def test_embedded_rows_on_vis_and_the_control_task_once_each():
    s = study("embedded")
    vis, sst2 = s.mechanism_runs("vis"), s.mechanism_runs("sst2")
    assert list(vis) == ["baseline", "xdbert", "nofacts", "mlm_match", "mlm", "one_cross", "two_epochs", "placeholder",
                         "caption_mlm", "caption_mlm_nofacts", "distill_kl", "distill_kl_nofacts", "distill_cos",
                         "distill_cos_nofacts", "full_xdbert", "full_nofacts", "clip_t", "clip_nofacts_t"]
    assert [r.name for r in s.runs("vis")] == [r.name for r in vis.values()]  # vis has the study's rows alone
    assert str(vis["clip_nofacts_t"].model_dir) == "models/pretrain_clip_nofacts"
    assert str(vis["clip_t"].model_dir) == "models/pretrain_clip" and vis["clip_t"].model == "clip"  # Table 1's CLIP-T
    assert str(vis["full_nofacts"].model_dir) == "models/crossmodal/bert/nofacts"
    assert all(r.protocol == "table1" and r.family in ("bert", "") for r in vis.values())
    # the control task: Table 1's and 8's runs of the rows reused, the others added once
    plain = Study.from_params(values("embedded"))
    names = [r.name for r in s.runs("sst2")]
    assert len(names) == len(set(names))
    assert names == [r.name for r in plain.runs("sst2")] + [
        "bert/nofacts", "bert/mlm_match", "bert/mlm", "bert/one_cross", "bert/two_epochs", "bert/placeholder",
        "bert/caption_mlm", "bert/caption_mlm_nofacts", "bert/distill_kl", "bert/distill_kl_nofacts", "bert/distill_cos",
        "bert/distill_cos_nofacts", "bert/full_nofacts", "clip_t", "clip_nofacts_t"]
    assert {r.name for r in sst2.values()} <= set(names) and sst2["baseline"].name == "bert/baseline"
    assert s.runs("rte") == plain.runs("rte")  # the other tasks as before
    with pytest.raises(PipelineError, match="task 'rte' has no mechanism study rows"):
        s.mechanism_runs("rte")


def test_micro_control_task_under_table3_s_own_protocol_gets_comparable_rows():
    """cola is one of micro's ablation tasks with `ablation_lr` set: Table 3's run of `nofacts` there is under its
    protocol, so the study's row is a Table 1 run of its own; the others are Table 1's runs, reused."""
    p = values("micro")
    s = Study.from_params(p, MechanismSettings.from_params(p))
    rows = s.mechanism_runs("cola")
    assert set(rows) == ROWS == set(s.mechanism_runs("vis"))
    assert {label: r.name for label, r in rows.items()} == {
        "baseline": "bert/baseline", "xdbert": "bert/xdbert", "nofacts": "bert/table1_nofacts",
        "caption_mlm": "bert/caption_mlm", "caption_mlm_nofacts": "bert/caption_mlm_nofacts",
        **{m: f"bert/{m}" for m in ("distill_kl", "distill_kl_nofacts")}, "full_xdbert": "bert/full_xdbert", "full_nofacts": "bert/full_nofacts", "clip_t": "clip_t",
        "clip_nofacts_t": "clip_nofacts_t"}
    assert all(r.protocol == "table1" for r in rows.values())
    assert str(rows["nofacts"].model_dir) == "models/adapted/bert/nofacts"
    runs = s.runs("cola")
    assert len({r.name for r in runs}) == len(runs)
    assert {r.name: r.protocol for r in runs}["bert/nofacts"] == "ablation"  # Table 3's run stays as it was
    cola = FinetuneSettings.from_params(p, get_task("cola"), MechanismSettings.from_params(p))
    assert all(cola.seeds_of(r) == p["finetune"]["seeds"] for r in rows.values())


def test_paper_profile_finetunes_what_it_did_before():
    p = values("paper")
    _, _, settings = stage_read(p)
    assert [s.task.name for s in settings] == p["tasks"]["names"] and settings[0].study.mechanism is None
    assert [r.name for r in settings[3].study.runs("cola")] == [
        "bert-b/baseline", "bert-b/xdbert", "bert-b/table3_baseline", "bert-b/table3_xdbert", "bert-b/mlm_match",
        "bert-b/mlm", "bert-b/one_cross", "bert-b/two_epochs", "bert-b/twenty_epochs", "bert-b/placeholder",
        "bert-b/full_xdbert", "electra-b/baseline", "electra-b/xdbert", "electra-b/full_xdbert", "electra-l/baseline",
        "electra-l/xdbert", "electra-l/full_xdbert", "clip_t"]
    assert not any(r.name.startswith("clip_nofacts") or "table1_" in r.name
                   for s in settings for r in s.study.runs(s.task.name))


def test_the_tables_ignore_vis_and_the_study_s_rows():
    """Aggregate builds its study without the mechanism section: its columns are `tasks.names`, its rows Table 1's,
    3's and 8's runs, and it reads no `mechanism` key."""
    a = AggregateSettings.from_params(values("embedded"))
    assert VIS not in [t.name for t in a.tasks] and a.study.mechanism is None
    assert a.study.table3_runs() == study("embedded").table3_runs()


def test_the_run_cache_code_key_leaves_out_the_world_generators():
    """An edit to the study's generators or settings must not make every saved run stale."""
    files = {str(f.relative_to(ROOT)) for f in code_files()}
    assert not files & {"xdbert/data/mechanism.py", "xdbert/data/synthetic/world.py", "xdbert/data/synthetic/words.py"}


@pytest.mark.parametrize("change, message", [
    (lambda p: p["tasks"].update(names=["rte", "vis"]), "`tasks.names` lists 'vis', the mechanism study's probe task"),
    (lambda p: p["mechanism"].update(models=["baseline", "nofacs"]), "`mechanism.models` names 'nofacs', which is not"),
    (lambda p: p["finetune"]["lr"].pop("vis"), "`finetune.lr.vis` must map base, large"),
])
def test_xdbert_check_refuses_what_the_study_cannot_run(change, message):
    p = values("embedded")
    check(p)
    change(p)
    with pytest.raises(PipelineError, match=message):
        check(p)
    for profile in ("micro", "paper"):
        check(values(profile))
