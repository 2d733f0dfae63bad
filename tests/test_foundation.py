"""Params checks, atomic outputs and the profile switch."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from xdbert import io, params
from xdbert.errors import PipelineError

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


def test_params_read_exponent_floats_as_numbers(tmp_path):
    """PyYAML alone reads `1e-4` as a string (YAML 1.1); DVC and users mean the number."""
    path = tmp_path / "params.yaml"
    path.write_text("profile: embedded\nadapt: {lr: 1e-4, warmup: 5.0e-2, epochs: 3, name: 1e, big: -2E+3}\n")
    adapt = params.load(path)["adapt"]
    assert adapt == {"lr": 1e-4, "warmup": 0.05, "epochs": 3, "name": "1e", "big": -2000.0}
    assert params.positive(adapt["lr"], "adapt.lr", float) == 1e-4


def test_read_json_names_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="missing file .*nope.json"):
        io.read_json(tmp_path / "nope.json")


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


def test_params_yaml_is_the_embedded_profile_and_profiles_share_keys():
    current = (ROOT / "params.yaml").read_text()
    assert current == (ROOT / "xdbert/profiles/embedded.yaml").read_text()

    def keys(d, prefix=""):
        out = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict) and k not in ("variants", "encoder_config", "train_sizes"):  # open mappings
                out |= keys(v, prefix + k + ".")
        return out

    embedded = yaml.safe_load(current)
    paper = yaml.safe_load((ROOT / "xdbert/profiles/paper.yaml").read_text())
    assert paper["profile"] == "paper" and embedded["profile"] == "embedded"
    # `finetune.lr.<task>.full` is optional: the full model's own rate, only where a profile sets one
    optional = {k for k in keys(embedded) | keys(paper) if k.startswith("finetune.lr.") and k.endswith(".full")}
    assert keys(embedded) - optional == keys(paper) - optional


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "xdbert.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_profile_switch_round_trip_and_refuses_to_lose_edits(tmp_path):
    r = cli("profile", "paper", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["profile"] == "paper"
    assert cli("profile", "embedded", cwd=tmp_path).returncode == 0
    assert (tmp_path / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()

    edited = (tmp_path / "params.yaml").read_text().replace("max_len: 128", "max_len: 64")
    (tmp_path / "params.yaml").write_text(edited)
    r = cli("profile", "paper", cwd=tmp_path)
    assert r.returncode == 2 and "would be lost" in r.stderr
    assert (tmp_path / "params.yaml").read_text() == edited
    assert cli("profile", "paper", "--force", cwd=tmp_path).returncode == 0

    r = cli("profile", "laptop", cwd=tmp_path)
    assert r.returncode == 2 and "allowed: embedded, paper" in r.stderr
