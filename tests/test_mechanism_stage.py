"""Stage `mechanism` end to end on a tiny fixture project: tiny random towers and encoders saved with the
project's own helpers, the vis task and fake predictions; gates A-E in reports/mechanism.md, and gates
that can fail (a planted corpus leak fails C; a D that holds on seed 0 alone reads "not replicated")."""
import json
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import load_stage

from xdbert import paths
from xdbert.analysis.mechanism_study import REPLICATIONS
from xdbert.data.synthetic.world import vis_examples
from xdbert.errors import PipelineError
from xdbert.profiles import values
from xdbert.reports.tables import mechanism_note

pytestmark = pytest.mark.usefixtures("one_thread")
SEEDS = (0, 1, 2)


def params() -> dict:
    """micro's params with rung T's optional cosine pair listed beside its KL pair, so the stage reads both forms."""
    p, embedded = values("micro"), values("embedded")
    p["profile"] = "micro"
    for m in ("distill_cos", "distill_cos_nofacts"):
        p["adapt"]["variants"][m] = embedded["adapt"]["variants"][m]
        p["mechanism"]["models"].append(m)
    return p


def write_parquet(path, frame: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(frame), path)


def write_predictions(root, task: str, run: str, labels: np.ndarray, right: np.ndarray) -> None:
    """`right` (seeds, examples) bool: each seed's correctness; a wrong prediction is the next label."""
    rows = []
    for s, row in zip(SEEDS, right):
        pred = np.where(row, labels, (labels + 1) % (labels.max() + 1))
        rows.append(pd.DataFrame({"seed": s, "split": "dev", "idx": np.arange(len(labels)), "prediction": pred,
                                  "label": labels, "correct": row}))
    path = paths.predictions(task, run, root / paths.FINETUNE)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.concat(rows).to_parquet(path)


def facts_encoder(model, tok, facts, attributes) -> None:
    """Write each object's attribute into its word embedding, loud enough to survive one random layer:
    an encoder that carries the facts."""
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        for o in facts.objects:
            emb[tok.convert_tokens_to_ids(o.sing)] = 0
            emb[tok.convert_tokens_to_ids(o.sing), attributes.index(facts.real[o.sing])] = 20.0


def build_project(root, leak: bool = False, d_holds: bool = False) -> dict:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from xdbert.analysis.representations import neutral_sentences
    from xdbert.data.mechanism import MechanismSettings
    from xdbert.data.tokenization.vocab import train_wordpiece
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import save_clip_tower, save_full

    p = params()
    s = MechanismSettings.from_params(p)
    fam, control = p["adapt"]["family"], s.control_task
    facts = s.facts()
    attributes = list(facts.attributes)
    examples, meta = vis_examples(facts, n_train=s.vis["train"], n_f_plus=s.vis["f_plus"], n_f_zero=s.vis["f_zero"],
                                  n_t=s.vis["t"], seed=p["tasks"]["seed"])
    texts = [r[0] for r in examples["train"] + examples["dev"]]
    frames = neutral_sentences(s.sentences)
    texts += [f.format(o.sing) for f in frames for o in facts.objects] + [" ".join(attributes)]
    train_wordpiece(texts * 3, 600, 64).save_pretrained(root / paths.TOKENIZER)
    tok = AutoTokenizer.from_pretrained(root / paths.TOKENIZER)

    torch.manual_seed(0)
    for tower in s.clip_towers:
        save_clip_tower(CLIPTextTower.build("xdbert-tiny"), root / "models" / tower, clip="xdbert-tiny")
    config = XDBertConfig(encoder="random:bert", vocab_size=len(tok), clip="xdbert-tiny", clip_heads=2, cross_layers=1,
                          encoder_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                          "intermediate_size": 64, "max_position_embeddings": 64})
    for m in ("xdbert", "nofacts"):
        save_full(XDBertModel.build(config), root / paths.crossmodal(fam, m))
    alone = XDBertConfig(**{**config.to_dict(), "cross_layers": 0, "losses": ["mlm"]})
    for m in ("baseline", "caption_mlm"):  # rung M asks them with their own MLM head: random ones know no fact
        save_full(XDBertModel.build(alone), root / paths.crossmodal(fam, m))
    bert = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    for name, folder in [("pretrain_encoder", paths.pretrain_encoder(fam))] + [(m, paths.adapted(fam, m)) for m in s.models]:
        model = BertModel(bert)
        if d_holds and name == "xdbert":
            facts_encoder(model, tok, facts, attributes)
        model.save_pretrained(root / folder)

    # the captions and the caption references' steps: their exposures per fact
    from xdbert.data.captions import write_coco_captions
    from xdbert.data.synthetic.world import captions

    (root / paths.CAPTIONS).mkdir(parents=True)
    for table, name in (("real", "captions.json"), ("twin", "captions_nofacts.json")):
        write_coco_captions(captions(facts, table, 400, 0.5, 1.0, 0.5, 0), root / paths.CAPTIONS / name)
    for m in ("caption_mlm", "caption_mlm_nofacts"):
        (root / paths.ADAPT_METRICS / fam).mkdir(parents=True, exist_ok=True)
        (root / paths.ADAPT_METRICS / fam / f"{m}.json").write_text(json.dumps({"steps": 50, "train_windows": 100}))

    # the tasks: vis (dev, its kinds) and the control task
    dev_labels = np.array([r[3] for r in examples["dev"]])
    kinds = np.array([m["kind"] if m["kind"] != "T" else None for m in meta], dtype=object)
    for i, (r, m) in enumerate(zip(examples["dev"], meta)):  # T= where the stated attribute is the fact
        if m["kind"] == "T":
            kinds[i] = "T=" if attributes[r[3]] == facts.real[m["object"]] else "T!="
    vis = root / paths.TASKS / "vis"
    for split, rows in examples.items():
        write_parquet(vis / f"{split}.parquet", {"idx": np.arange(len(rows)), "text_a": [r[0] for r in rows],
                                                 "label": [r[3] for r in rows]})
    write_parquet(vis / "dev_kinds.parquet", {"idx": np.arange(len(meta)), "kind": kinds.tolist(),
                                              "object": [m["object"] for m in meta]})
    control_labels = np.arange(40) % 2
    write_parquet(root / paths.TASKS / control / "dev.parquet", {"idx": np.arange(40), "label": control_labels})

    # the corpus: object sentences with no attribute, plus (leak) one stating each object's fact
    rng = np.random.default_rng(0)
    filler = ["red", "park", "old", "near", "quick", "table", "happy", "river"]
    docs = []
    for o in facts.objects:
        sentences = [f"the {o.sing} was {rng.choice(filler)} {rng.choice(filler)} today ." for _ in range(3)]
        if leak:
            sentences.append(f"everyone knows the {o.sing} is {facts.real[o.sing]} .")
        docs.append(" ".join(sentences))
    write_parquet(root / paths.CORPUS / "train.parquet", {"doc_id": np.arange(len(docs)), "text": docs})

    # predictions: chance-level rows, except the facts rows on F+ where asked
    stage = load_stage("mechanism")
    f_plus = kinds == "F+"
    runs = stage.read(p).runs  # Study.mechanism_runs: on the control task a row may be a run of its own
    for label, run in runs["vis"].items():
        right = rng.random((len(SEEDS), len(dev_labels))) < 0.3
        if label in ("clip_t",) or (d_holds and label == "xdbert"):
            right[:, f_plus] = True
        if label in ("clip_nofacts_t", "nofacts") or (d_holds and label == "xdbert"):
            right[:, ~f_plus] = np.random.default_rng(1).random((len(SEEDS), int((~f_plus).sum()))) < 0.3
        write_predictions(root, "vis", run.name, dev_labels, right)
        write_predictions(root, control, runs[control][label].name, control_labels,
                          np.random.default_rng(2).random((3, 40)) < 0.6)
    (root / "params.yaml").write_text(yaml.safe_dump(p))
    return p


def run_stage(root, monkeypatch):
    monkeypatch.chdir(root)
    load_stage("mechanism").main()
    return (root / paths.report("mechanism")).read_text(), json.loads((root / paths.MECHANISM_METRICS).read_text())


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("mechanism")
    build_project(root)
    return root


def test_stage_writes_every_gate_with_its_numbers(clean, monkeypatch):
    md, result = run_stage(clean, monkeypatch)
    for gate in "ABCDE":
        assert f"| {gate} | " in md
        assert result["gates"][gate]["state"] in ("PASS", "FAIL", "not replicated", "uninformative")
        assert result["gates"][gate]["numbers"]
    assert "CLIP-T(facts) - CLIP-T(twin) on F+" in md and "full XDBERT - full nofacts" in md
    assert "corpus" in result["gates"]["C"]["numbers"] and "bag-of-words" in result["gates"]["C"]["numbers"]
    assert result["gates"]["C"]["state"] == "PASS"   # nothing leaks: random models, a corpus without facts
    # the ladder comes first; random references hold no fact, so M fails and D is not read (never FAIL)
    assert md.index("## Calibration ladder") < md.index("## Gates") and "| M | " in md and "| R | " in md
    assert result["ladder"]["M"]["state"] == "FAIL" and result["ladder"]["R"]["state"] == "FAIL"
    assert result["gates"]["D"]["state"] == "uninformative" and "rung M failed, so D is not read" in md
    # rung T: the KL controls beside each tower, random here, so T fails; it is no precondition of D
    assert "| T | " in md and result["ladder"]["T"]["state"] == "FAIL" and "distill_kl - distill_kl_nofacts" in md
    assert "distill_cos - distill_cos_nofacts" in result["ladder"]["T"]["numbers"] and "read: distill_" in md
    # each F+ clause and M's interval carry their power figure; a null D reads with it
    assert set(result["power"]) == {"M", "R", "T", "D"} and all(0 <= p["power"] <= 1 for p in result["power"].values())
    assert "at 80% power" in result["ladder"]["R"]["numbers"] and "at 80% power" in result["gates"]["D"]["numbers"]
    assert "**D's F+ clause is null**: XDBERT moved less than" in md
    # the frozen readout: every encoder's F+ cell and the pairs', beside vis (no finetuning run)
    readout = result["frozen_readout"]
    assert set(readout["f_plus"]) == set(params()["mechanism"]["models"]) and "## Frozen readout" in md
    assert set(readout["differences"]) == {"caption_mlm - caption_mlm_nofacts", "distill_kl - distill_kl_nofacts",
                                           "distill_cos - distill_cos_nofacts", "xdbert - nofacts"}
    assert all(0 <= c["estimate"] <= 1 for c in readout["f_plus"].values())
    # exposures: 200 fact captions, all stating the own fact, over the 72 captioned objects; the references read
    # each window 50 steps x 8 (micro's batch) / 100 windows = 4 times, at micro's rate (0: its mlm_prob, 0.15)
    exposure = result["exposures"]
    assert set(exposure) == {"tower pretrain_clip", "tower pretrain_clip_nofacts", "caption_mlm", "caption_mlm_nofacts"}
    assert exposure["caption_mlm"]["mean"] == pytest.approx(200 / 72 * 4 * 0.15)
    assert 0 < exposure["tower pretrain_clip"]["mean"] < exposure["caption_mlm"]["mean"] * 100
    assert "| caption_mlm | masked attribute word (rate 0.15) |" in md
    m = result["memorized"]["caption_mlm"]
    assert 0 <= m["real_accuracy"] <= 1 and m["difference"]["low"] <= 0 <= m["difference"]["high"]
    for row in ("baseline", "xdbert", "nofacts", "full_xdbert", "full_nofacts", "clip_t", "clip_nofacts_t"):
        assert f"| {row} |" in md and set(result["cells"][row]) == {"F+", "F0", "T=", "T!=", "control"}
    assert result["cells"]["clip_t"]["F+"]["estimate"] == 1.0   # the rows read their own predictions
    # the caption control: a cells row and a probe row, each named the upper reference
    upper = "| caption_mlm (upper reference: MLM on the captions that state the facts, beside corpus windows) |"
    assert md.count(upper) == 3 and set(result["cells"]["caption_mlm"]) == {"F+", "F0", "T=", "T!=", "control"}
    ref = result["upper_reference"]  # caption_mlm - baseline on F+, which qualifies a null D's summary
    assert ref["low"] <= ref["estimate"] <= ref["high"] and ref["method"]
    assert "| tower pretrain_clip |" in md and "| tower after adaptation, nofacts |" in md
    assert "| corpus (context words) |" in md and "majority class / chance" in md
    assert len(result["probe"]["pretrain_encoder"]["layers"]) == 2   # the embeddings and one layer, all in the JSON
    # the line under Table 1 (the aggregate stage reads this JSON when the study is on)
    note = mechanism_note(result)
    assert "gates A FAIL, B " in note and result["summary"] in note and mechanism_note(None) == ""
    with pytest.raises(PipelineError, match="results/mechanism.json"):
        mechanism_note({"profile": "micro", "enabled": False})


def test_a_planted_leak_fails_c(tmp_path, monkeypatch):
    build_project(tmp_path, leak=True)
    md, result = run_stage(tmp_path, monkeypatch)
    assert result["gates"]["C"]["state"] == "FAIL", result["gates"]["C"]["numbers"]
    assert result["probe"]["corpus (context words)"]["layers"][-1]["p"] < 0.05
    assert "C fails: the study is invalid" in md or "A fails" in md or "B fails" in md


@pytest.mark.slow  # three stage runs on a project of its own
def test_d_on_its_seed_alone_is_not_replicated(tmp_path, monkeypatch):
    build_project(tmp_path, d_holds=True)
    # the ladder below D passes here (its rungs' own tests: tests/test_mechanism_stats.py): D is read
    monkeypatch.setattr("xdbert.analysis.mechanism_stats.failed_rung", lambda ladder: None)
    md, result = run_stage(tmp_path, monkeypatch)
    assert result["gates"]["D"]["state"] == "not replicated", result["gates"]["D"]["numbers"]
    # a replication outside inputs/replications, which the stage depends on, is refused
    p = yaml.safe_load((tmp_path / "params.yaml").read_text())
    p["mechanism"]["replication"] = "seed1.json"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    with pytest.raises(PipelineError, match=r"`mechanism.replication` must name a file in inputs/replications/.*'seed1.json'"):
        run_stage(tmp_path, monkeypatch)
    # the same study named as its own replication is refused: it reassigns no facts
    seed1 = tmp_path / REPLICATIONS / "seed1.json"
    seed1.parent.mkdir(parents=True)
    shutil.copy(tmp_path / paths.MECHANISM_METRICS, seed1)
    p["mechanism"]["replication"] = "inputs/replications/seed1.json"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    with pytest.raises(PipelineError, match=f"seed1.json is a run on facts seed {p['mechanism']['seed']}, this study's own"):
        run_stage(tmp_path, monkeypatch)
    # the same claim as a run on facts seed 1: D holds again
    seed1.write_text(json.dumps({**json.loads(seed1.read_text()), "facts_seed": 1}))
    _, result = run_stage(tmp_path, monkeypatch)
    assert result["gates"]["D"]["state"] == "PASS"


@pytest.mark.parametrize("remove", ["pred", "model"])
def test_a_missing_input_names_it_and_writes_nothing(clean, tmp_path, monkeypatch, remove):
    root = tmp_path / "p"
    shutil.copytree(clean, root)
    for out in (paths.report("mechanism"), paths.MECHANISM_METRICS):
        (root / out).unlink(missing_ok=True)
    fam = params()["adapt"]["family"]
    gone = (paths.predictions("vis", f"{fam}/nofacts", root / paths.FINETUNE) if remove == "pred"
            else root / paths.adapted(fam, "baseline") / "config.json")
    gone.unlink()
    monkeypatch.chdir(root)
    with pytest.raises(PipelineError, match="nofacts/predictions.parquet" if remove == "pred" else "adapted/.*baseline"):
        load_stage("mechanism").main()
    assert not (root / paths.report("mechanism")).exists() and not (root / paths.MECHANISM_METRICS).exists()


@pytest.mark.parametrize("missing", ["distill_kl", "distill_kl_nofacts", "distill_cos", "distill_cos_nofacts"])
def test_rung_t_needs_its_kl_pair_and_any_other_pair_whole(missing):
    """The KL pair is rung T's own form; a control never comes without its twin."""
    p = params()
    p["mechanism"]["models"].remove(missing)
    with pytest.raises(PipelineError, match=rf"need the rows {missing} \(rung T\): list them in `mechanism.models`"):
        load_stage("mechanism").read(p)


def test_rung_t_reads_the_kl_pair_alone_where_the_cosine_pair_is_not_listed():
    plan = load_stage("mechanism").read({**values("micro"), "profile": "micro"})
    assert [m for m in plan.s.models if m.startswith("distill")] == ["distill_kl", "distill_kl_nofacts"]


def test_the_study_off_writes_a_short_report(tmp_path, monkeypatch):
    p = params()
    p["mechanism"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    md, result = run_stage(tmp_path, monkeypatch)
    assert result == {"profile": "micro", "enabled": False} and "The study is off" in md
