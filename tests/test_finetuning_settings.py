"""The `finetune` settings: learning rates (Table 5, layer-wise decay), families, and the study's runs
(Tables 1, 3 and 8)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from keyword_tasks import keyword_tables, save_tiny_bert, settings
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute.heads import EncoderClassifier
from xdbert.finetuning.compute.rates import layer_depths, parameter_groups
from xdbert.finetuning.control.prepare import prepare
from xdbert.finetuning.control.runs import Study
from xdbert.finetuning.control.settings import FinetuneSettings, learning_rate, size_of
from xdbert.model.families import family
from xdbert.profiles import values

pytestmark = pytest.mark.usefixtures("one_thread")


def test_layer_lr_decay_assigns_the_expected_rates(tmp_path):
    directory = save_tiny_bert(tmp_path / "bert3", layers=3)
    model = EncoderClassifier(directory, get_task("rte"))
    groups = parameter_groups(model, lr=1.0, weight_decay=0.01, layer_lr_decay=0.5)
    lr_of = {n: g["lr"] for g in groups for n in g["names"]}
    wd_of = {n: g["weight_decay"] for g in groups for n in g["names"]}
    assert lr_of["model.bert.embeddings.word_embeddings.weight"] == 0.5 ** 4       # below layer 0
    assert lr_of["model.bert.embeddings.LayerNorm.weight"] == 0.5 ** 4
    assert lr_of["model.bert.encoder.layer.0.attention.self.query.weight"] == 0.5 ** 3
    assert lr_of["model.bert.encoder.layer.2.output.dense.weight"] == 0.5           # the top layer
    assert lr_of["model.bert.pooler.dense.weight"] == 1.0 and lr_of["model.classifier.weight"] == 1.0
    assert wd_of["model.classifier.weight"] == 0.01 and wd_of["model.classifier.bias"] == 0.0
    assert wd_of["model.bert.encoder.layer.1.output.LayerNorm.weight"] == 0.0
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    off = parameter_groups(model, lr=2e-5, weight_decay=0.01, layer_lr_decay=1.0)
    assert {g["lr"] for g in off} == {2e-5} and len(off) == 2  # one group per (rate, decay): fewer optimizer launches
    # CLIP's naming and two stacks (the full model): each stack counts from its own top
    depths = layer_depths([
        "tower.token_embedding.weight", "tower.positional_embedding", "tower.transformer.resblocks.0.mlp.c_fc.weight",
        "tower.transformer.resblocks.1.ln_1.weight", "tower.ln_final.weight", "out.weight",
        "xd.encoder.embeddings.word_embeddings.weight", "xd.encoder.encoder.layer.0.output.dense.weight",
        "xd.encoder.encoder.layer.3.output.dense.weight", "xd.cross_layers.0.language_ffn.dense_in.weight",
    ])
    assert depths == {
        "tower.token_embedding.weight": 3, "tower.positional_embedding": 3, "tower.transformer.resblocks.0.mlp.c_fc.weight": 2,
        "tower.transformer.resblocks.1.ln_1.weight": 1, "tower.ln_final.weight": 0, "out.weight": 0,
        "xd.encoder.embeddings.word_embeddings.weight": 5, "xd.encoder.encoder.layer.0.output.dense.weight": 4,
        "xd.encoder.encoder.layer.3.output.dense.weight": 1, "xd.cross_layers.0.language_ffn.dense_in.weight": 0,
    }


def test_paper_learning_rates_by_task_and_size():
    table = {t: dict(rates) for t, rates in values("paper")["finetune"]["lr"].items()}
    assert learning_rate(table, get_task("rte"), size_of(768)) == 1e-4
    assert learning_rate(table, get_task("stsb"), size_of(1024)) == 5e-5
    assert learning_rate(table, get_task("mnli"), size_of(768)) == 2e-5
    assert learning_rate(table, get_task("swag"), size_of(1024)) == 1e-5
    with pytest.raises(PipelineError, match="finetune.lr"):
        learning_rate({"mnli": {"base": 1e-3}}, get_task("rte"), "base")
    # the full cross-modal model takes the task's `full` rate where there is one, else the encoder's
    table["rte"]["full"] = 3e-5
    assert learning_rate(table, get_task("rte"), "base", "full") == 3e-5
    assert learning_rate(table, get_task("rte"), "base", "encoder") == 1e-4
    assert learning_rate(table, get_task("stsb"), "base", "full") == 1e-4


TWO_FAMILIES = {"bert": {"label": "BERT-b", "size": "base", "layer_lr_decay": 1.0},
                "electra": {"label": "ELECTRA-l", "encoder": "random:electra", "size": "large", "layer_lr_decay": 0.9}}


def test_runs_of_a_task_follow_the_tables():
    """Every family's Table 1 and Table 8 models; Table 3's ablations of `adapt.family` alone; CLIP-T once."""
    f = {"models": ["baseline", "xdbert"], "ablations": ["mlm"], "ablation_tasks": ["rte"], "full_models": ["xdbert"],
         "clip_tasks": ["rte"], "ablation_lr": None, "ablation_seeds": None}
    adapt = {"family": "bert", "variants": {"mlm": {"losses": ["mlm"]}}}
    study = Study.from_params({"finetune": f, "families": TWO_FAMILIES, "adapt": adapt})
    T1 = "table1"
    assert study.runs("rte") == [
        ("encoder", "baseline", "bert/baseline", T1, "bert"), ("encoder", "xdbert", "bert/xdbert", T1, "bert"),
        ("encoder", "mlm", "bert/mlm", T1, "bert"), ("full", "xdbert", "bert/full_xdbert", T1, "bert"),
        ("encoder", "baseline", "electra/baseline", T1, "electra"), ("encoder", "xdbert", "electra/xdbert", T1, "electra"),
        ("full", "xdbert", "electra/full_xdbert", T1, "electra"), ("clip", "clip", "clip_t", T1, "")]
    assert [r.name for r in study.runs("sst2")] == ["bert/baseline", "bert/xdbert", "bert/full_xdbert", "electra/baseline",
                                                    "electra/xdbert", "electra/full_xdbert"]
    assert [str(r.model_dir) for r in study.runs("rte")] == [
        "models/adapted/bert/baseline", "models/adapted/bert/xdbert", "models/adapted/bert/mlm", "models/crossmodal/bert/xdbert",
        "models/adapted/electra/baseline", "models/adapted/electra/xdbert", "models/crossmodal/electra/xdbert",
        "models/pretrain_clip"]
    assert study.table3_runs() == {"baseline": "bert/baseline", "xdbert": "bert/xdbert", "mlm": "bert/mlm"}  # Table 1's runs
    with pytest.raises(PipelineError, match=r"`finetune.models` names 'mlm'; every family adapts only baseline, xdbert"):
        Study.from_params({"finetune": {**f, "models": ["baseline", "mlm"]}, "families": TWO_FAMILIES, "adapt": adapt})
    with pytest.raises(PipelineError, match=r"`finetune.ablations` names 'mlm_mach', which is not an adapt variant or "
                                            r"baseline; allowed: baseline, xdbert, mlm$"):  # before any model folder is looked for
        Study.from_params({"finetune": {**f, "ablations": ["mlm_mach"]}, "families": TWO_FAMILIES, "adapt": adapt})
    with pytest.raises(PipelineError, match=r"`adapt.family` names 'roberta', which is not a family; allowed: bert, electra"):
        Study.from_params({"finetune": f, "families": TWO_FAMILIES, "adapt": {**adapt, "family": "roberta"}})
    # a run listed twice would be trained twice and counted twice in its median
    with pytest.raises(PipelineError, match=r"`finetune.ablation_tasks` lists a name twice: \['rte', 'rte'\]"):
        Study.from_params({"finetune": {**f, "ablation_tasks": ["rte", "rte"]}, "families": TWO_FAMILIES, "adapt": adapt})
    with pytest.raises(PipelineError, match=r"`finetune.clip_tasks` must be a list of names; got 'rte'"):
        Study.from_params({"finetune": {**f, "clip_tasks": "rte"}, "families": TWO_FAMILIES, "adapt": adapt})


def test_a_family_gives_its_size_class_and_layer_decay(bert_dir):
    """ELECTRA-l's recipe: Table 5's large rate and a decay of 0.9, whatever the width of the model at hand."""
    spec = get_task("sst2")
    s = dataclasses.replace(settings(spec), lr={"sst2": {"base": 1e-4, "large": 1e-5}})
    large = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), s, family=family(
        {"families": TWO_FAMILIES, "adapt": {"family": "bert"}}, "electra"))
    assert (large.size, large.hyperparameters.lr, large.hyperparameters.layer_lr_decay) == ("large", 1e-5, 0.9)
    plain = prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), s)  # no family: the width decides, no decay
    assert (plain.size, plain.hyperparameters.lr, plain.hyperparameters.layer_lr_decay) == ("base", 1e-4, 1.0)


def test_table3_protocol_of_the_paper_reruns_its_rows_at_one_rate_and_five_seeds():
    """The paper ran every ablation at lr 1e-4 with 5 runs, CoLA (Table 1: 2e-5) and RTE (Table 1: 9 seeds) too."""
    p = values("paper")
    cola, rte = FinetuneSettings.from_params(p, get_task("cola")), FinetuneSettings.from_params(p, get_task("rte"))
    study = cola.study
    assert (study.protocol.lr, study.protocol.seeds) == (1e-4, [0, 1, 2, 3, 4])
    runs = {r.name: r for r in study.runs("cola")}
    assert runs["bert-b/xdbert"].protocol == "table1" and runs["bert-b/table3_xdbert"].protocol == "ablation"
    assert runs["bert-b/table3_baseline"].model_dir == Path("models/adapted/bert-b/baseline")
    assert runs["bert-b/mlm_match"].protocol == runs["bert-b/twenty_epochs"].protocol == "ablation"
    assert "bert-b/table3_xdbert" not in {r.name for r in study.runs("sst2")}  # only on the ablation tasks
    assert not any(r.name.startswith("electra") and r.protocol == "ablation" for r in runs.values())  # BERT-b's alone
    assert cola.hyperparameters("base", "encoder").lr == 2e-5                 # Table 1's CoLA rate
    assert cola.hyperparameters("base", "encoder", "ablation").lr == 1e-4     # Table 3's
    assert rte.seeds_of(runs["bert-b/xdbert"]) == list(range(9)) and rte.seeds_of(runs["bert-b/table3_xdbert"]) == [0, 1, 2, 3, 4]
    assert study.table3_runs()["baseline"] == "bert-b/table3_baseline" and study.table3_runs()["mlm"] == "bert-b/mlm"
