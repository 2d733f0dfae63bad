"""Params checks, atomic outputs and the profile switch."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from xdbert import io, params, params_check, profiles
from xdbert.errors import PipelineError
from xdbert.model.families import families
from xdbert.model.settings import ModelSettings

ROOT = Path(__file__).resolve().parents[1]


def test_atomic_path_replaces_only_on_success(tmp_path):
    target = tmp_path / "out" / "a.txt"
    io.write_text(target, "first")
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "first"
    assert [p.name for p in target.parent.iterdir()] == ["a.txt"]  # no temp left behind


def test_atomic_dir_swaps_whole_directory(tmp_path):
    target = tmp_path / "shards"
    with io.atomic_path(target, is_dir=True) as tmp:
        (tmp / "x").write_text("1")
    with pytest.raises(ValueError):
        with io.atomic_path(target, is_dir=True) as tmp:
            (tmp / "y").write_text("2")
            raise ValueError
    assert sorted(p.name for p in target.iterdir()) == ["x"]
    with io.atomic_path(target, is_dir=True) as tmp:
        (tmp / "z").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]


@pytest.mark.parametrize("umask, folder, file", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664), (0o077, 0o700, 0o600)])
def test_outputs_get_the_modes_the_umask_gives(tmp_path, umask, folder, file):
    """A shared cluster group must read the outputs: a folder written through a private temp folder gets
    the mode any folder the user makes gets, not mkdtemp's 0700."""
    old = os.umask(umask)
    try:
        with io.atomic_path(tmp_path / "models" / "adapted", is_dir=True) as tmp:
            (tmp / "config.json").write_text("{}")
        io.write_text(tmp_path / "reports" / "table1.md", "| |")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "models" / "adapted").stat().st_mode) == folder
    assert stat.S_IMODE((tmp_path / "models" / "adapted" / "config.json").stat().st_mode) == file
    assert stat.S_IMODE((tmp_path / "reports" / "table1.md").stat().st_mode) == file


def test_params_read_exponent_floats_as_numbers(tmp_path):
    """PyYAML alone reads `1e-4` as a string (YAML 1.1); DVC and users mean the number."""
    path = tmp_path / "params.yaml"
    path.write_text("profile: embedded\nadapt: {lr: 1e-4, warmup_ratio: 5.0e-2, epochs: 3, precision: 1e, seed: -2E+3}\n")
    adapt = params.load(path)["adapt"]
    assert adapt == {"lr": 1e-4, "warmup_ratio": 0.05, "epochs": 3, "precision": "1e", "seed": -2000.0}
    assert params.positive(adapt["lr"], "adapt.lr", float) == 1e-4


def test_read_json_names_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="missing file .*nope.json"):
        io.read_json(tmp_path / "nope.json")


@pytest.mark.parametrize("content, message", [(b"[1, 2]", "holds a JSON list, not the object its stage writes"),
                                              (b"\xff\xfe\x00", "is not valid JSON"), (b'{"a": ', "is not valid JSON")])
def test_read_json_refuses_what_no_stage_writes(tmp_path, content, message):
    (tmp_path / "m.json").write_bytes(content)
    with pytest.raises(PipelineError, match=message + ".*delete it and rerun `dvc repro`"):
        io.read_json(tmp_path / "m.json")


def test_a_params_file_that_is_not_text_is_one_error(tmp_path):
    (tmp_path / "params.yaml").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PipelineError, match=r"params.yaml is not UTF-8 text .*`xdbert profile embedded`"):
        params.load(tmp_path / "params.yaml")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: params.choice("gpt", "task", ["rte", "mrpc"]), "unknown task 'gpt'; allowed: rte, mrpc"),
        (lambda: params.positive(-1, "adapt.epochs"), "`adapt.epochs` must be a positive integer; got -1"),
        (lambda: params.positive(0.0, "adapt.lr", float), "`adapt.lr` must be a positive number"),
        (lambda: params.positive(1.5, "tokenize.max_len"), "positive integer; got 1.5"),
        (lambda: params.subset([], "adapt.losses", ["mlm"]), "`adapt.losses` is empty"),
        (lambda: params.subset(["mlm", "itm"], "adapt.losses", ["mlm", "match"]), "unknown entry of `adapt.losses` 'itm'"),
        (lambda: params.fraction(1.5, "adapt.mlm_prob"), "between 0 and 1"),
    ],
)
def test_param_checks_name_key_and_allowed(call, message):
    with pytest.raises(PipelineError) as e:
        call()
    assert message in str(e.value)


def test_unknown_profile_is_refused(tmp_path):
    (tmp_path / "params.yaml").write_text("profile: laptop\n")
    with pytest.raises(PipelineError, match="unknown profile 'laptop'; allowed: embedded, paper"):
        params.load(tmp_path / "params.yaml")
    for text in ("", "corpus: {}\n"):  # empty, or written by hand without one
        (tmp_path / "params.yaml").write_text(text)
        with pytest.raises(PipelineError, match="params.yaml has no `profile` key; allowed: embedded, paper"):
            params.load(tmp_path / "params.yaml")


def keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("families", "variants", "encoder_config", "train_sizes"):  # open mappings
            out |= keys(v, prefix + k + ".")
    return out


def test_paper_profile_is_an_overlay_of_the_defaults():
    embedded, paper = profiles.values("embedded"), profiles.values("paper")
    assert paper["profile"] == "paper" and embedded["profile"] == "embedded"
    # `finetune.lr.<task>.full` is optional: the full model's own rate, only where a profile sets one
    optional = {k for k in keys(embedded) | keys(paper) if k.startswith("finetune.lr.") and k.endswith(".full")}
    assert keys(embedded) - optional == keys(paper) - optional
    overlay_text = (ROOT / "xdbert/profiles/paper.yaml").read_text()
    assert "n_boot: 1000" in overlay_text and "\n  seeds:" not in overlay_text  # only what differs is written there
    # `!replace` mappings replace whole; others merge key by key
    assert paper["tasks"]["train_sizes"] == {} and paper["finetune"]["lr"]["sst2"] == {"base": 2e-5, "large": 1e-5}
    assert "hidden_dropout_prob" not in paper["model"]["encoder_config"]
    assert paper["adapt"]["loss_weights"] == {"mlm": 1.0, "match": 1.0, "cliptc": 1.0}
    # the mechanism study's twin variants have no twin tower or twin captions in the paper profile, and rung T's
    # controls distil a stand-in trained as a language model, which a downloaded CLIP is not
    assert (set(paper["adapt"]["variants"]) == set(embedded["adapt"]["variants"]) - {
        "nofacts", "caption_mlm_nofacts", "distill_kl", "distill_kl_nofacts", "distill_cos", "distill_cos_nofacts"}
        | {"twenty_epochs"})
    assert not paper["mechanism"]["enabled"] and embedded["mechanism"]["enabled"]
    # Table 1's three families, named and labelled as the paper names them; ELECTRA's own finetuning recipe
    assert {name: (f.label, f.size, f.layer_lr_decay) for name, f in families(paper).items()} == {
        "bert-b": ("BERT-b", "base", 1.0), "electra-b": ("ELECTRA-b", "base", 0.8), "electra-l": ("ELECTRA-l", "large", 0.9)}
    assert ModelSettings.from_params(paper, "electra-l").encoder == "google/electra-large-discriminator"
    assert ModelSettings.from_params(paper, "bert-b").encoder == "bert-base-uncased"  # `model.encoder`, inherited
    assert list(families(embedded)) == ["bert"]  # one tiny family: the embedded study's time matters


def test_the_micro_profile_runs_every_ablation_but_two_epochs_as_the_defaults_write_it():
    """micro.yaml replaces `adapt.variants` whole to leave out `two_epochs` and rung T's optional cosine pair (no
    end-to-end test reads their runs): every other variant must stay the defaults' own, and Table 3 lists the same
    ones."""
    embedded, micro = profiles.values("embedded"), profiles.values("micro")
    left_out = {"two_epochs", "distill_cos", "distill_cos_nofacts"}
    kept = {name: v for name, v in embedded["adapt"]["variants"].items() if name not in left_out}
    for name in ("caption_mlm", "caption_mlm_nofacts"):  # its 600-piece vocabulary cuts the attribute words
        kept[name] = {**kept[name], "attribute_mlm_prob": 0.0}
    assert micro["adapt"]["variants"] == kept and list(micro["adapt"]["variants"]) == list(kept)
    assert micro["finetune"]["ablations"] == [name for name in embedded["finetune"]["ablations"] if name != "two_epochs"]


def test_rendered_profiles_are_their_values_with_the_defaults_comments():
    assert profiles.render("embedded") == (ROOT / "xdbert/profiles/embedded.yaml").read_text()
    # the committed params.yaml is written by `xdbert profile embedded`, never by hand
    assert (ROOT / "params.yaml").read_text() == profiles.render("embedded"), "run `xdbert profile embedded --reset`"
    text = profiles.render("paper")
    assert params.read_yaml_text(text) == profiles.values("paper")
    assert "# fail if more windows than this overflow the CLIP blocks" in text  # an unchanged key keeps its comment
    assert "These values are the PAPER profile" in text


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "xdbert.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_profile_switch_keeps_the_users_changes(tmp_path):
    path = tmp_path / "params.yaml"
    assert cli("profile", "paper", cwd=tmp_path).returncode == 0
    head, aggregate = path.read_text().replace("  epochs: 3\n", "  epochs: 4\n").split("\naggregate:", 1)
    path.write_text(head + "\naggregate:" + aggregate.replace("n_boot: 1000", "n_boot: 500", 1))  # not probes.n_boot
    r = cli("profile", "embedded", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "kept: finetune.epochs = 4" in r.stdout and "kept: aggregate.n_boot = 500" in r.stdout
    expected = profiles.values("embedded")
    expected["finetune"]["epochs"], expected["aggregate"]["n_boot"] = 4, 500
    assert params.load(path) == expected
    assert cli("profile", "paper", cwd=tmp_path).returncode == 0  # and back: still the user's values
    assert params.load(path)["finetune"]["epochs"] == 4 and params.load(path)["adapt"]["lr"] == 1e-4

    r = cli("profile", "embedded", "--reset", cwd=tmp_path)
    assert r.returncode == 0 and "dropped: finetune.epochs = 4" in r.stdout
    assert path.read_text() == (ROOT / "xdbert/profiles/embedded.yaml").read_text()


def test_profile_switch_refuses_bad_input_and_keeps_the_file(tmp_path):
    r = cli("profile", "laptop", cwd=tmp_path)
    assert r.returncode == 2 and "allowed: embedded, paper" in r.stderr
    assert not (tmp_path / "params.yaml").exists()
    (tmp_path / "params.yaml").write_text("profile: embedded\nadapt: [unclosed\n")
    r = cli("profile", "paper", cwd=tmp_path)
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    assert (tmp_path / "params.yaml").read_text() == "profile: embedded\nadapt: [unclosed\n"
    # a change to a family the paper profile does not have: refused before anything is written
    edited = (ROOT / "xdbert/profiles/embedded.yaml").read_text().replace("    layer_lr_decay: 1.0", "    layer_lr_decay: 0.9", 1)
    (tmp_path / "params.yaml").write_text(edited)
    r = cli("profile", "paper", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "error: profile paper with your changes: missing param `families.bert.label`" in r.stderr and "--reset" in r.stderr
    assert (tmp_path / "params.yaml").read_text() == edited
    assert cli("profile", "paper", "--reset", cwd=tmp_path).returncode == 0
    # a folder, or a path that cannot be written: one line, no traceback
    r = cli("profile", "paper", "--params", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path} is a folder; give the params file to write (params.yaml)"
    r = cli("profile", "paper", "--params", str(tmp_path / "params.yaml" / "params.yaml"), cwd=tmp_path)  # under a file
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "error: could not write" in r.stderr, r.stderr
    r = cli("check", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "is a folder; give the params file" in r.stderr


def test_every_profile_key_is_known_and_unknown_keys_are_refused(tmp_path):
    """The key lists beside each section's settings, gathered by `xdbert check`, are the profiles' keys; the
    sections params.load knows are theirs too."""
    keys = params_check.SECTION_KEYS
    assert tuple(keys) == params.SECTIONS
    for name in params.PROFILES:
        values = profiles.values(name)
        assert {s for s, v in values.items() if isinstance(v, dict)} == set(keys)
        for section, known in keys.items():
            assert known is None or set(values[section]) <= set(known)  # None: names of the user's (families)
    assert {(s, k) for s in keys for k in keys[s] or ()} == {
        (s, k) for name in params.PROFILES for s, v in profiles.values(name).items() if isinstance(v, dict) and keys[s]
        for k in v}
    path = tmp_path / "params.yaml"
    path.write_text("profile: embedded\nadapt: {lrr: 1e-4}\n")
    with pytest.raises(PipelineError, match=r"unknown param `adapt.lrr` \(did you mean `adapt.lr`\?\)"):
        params_check.check_keys(params.load(path))
    mine = tmp_path / "mine.yaml"  # the file `xdbert check mine.yaml` was given, named as given
    mine.write_text("profile: embedded\nfinetunes: {epochs: 3}\n")
    with pytest.raises(PipelineError, match=r"unknown section `finetunes` in .*mine.yaml \(did you mean `finetune`\?\)"):
        params.load(mine)
    with pytest.raises(PipelineError, match=r"section `adapt` of params.yaml must map its keys to values; got list"):
        params.section({"adapt": [1, 2]}, "adapt")


def test_a_stage_refuses_a_misspelt_key_before_any_work(tmp_path):
    text = profiles.render("embedded").replace("  n_docs: 900", "  n_doc: 900")
    (tmp_path / "params.yaml").write_text(text)
    r = subprocess.run([sys.executable, str(ROOT / "stages/corpus.py")], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: unknown param `corpus.n_doc` (did you mean `corpus.n_docs`?); "
                                             "`corpus` has: source, hub_id, hub_config, n_docs, sentences_per_doc, seed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written
