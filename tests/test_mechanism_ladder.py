"""bench/mechanism_ladder.py, the calibration's de-risk script: its levers, and its refusal of the study's seeds."""
import importlib.util
import sys
from pathlib import Path

import pytest

from xdbert.data.mechanism import MechanismSettings
from xdbert.params import read_yaml_text
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]


def ladder():
    spec = importlib.util.spec_from_file_location("mechanism_ladder", ROOT / "bench" / "mechanism_ladder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_lever_sets_its_keys_on_the_embedded_profile_and_nothing_else():
    p = read_yaml_text(ladder().lever_params(["mechanism.caption_frames=3", "adapt.variants.caption_mlm.epochs=4"]))
    embedded = values("embedded")
    assert MechanismSettings.from_params(p).caption_frames == 3 and p["adapt"]["variants"]["caption_mlm"]["epochs"] == 4
    p["mechanism"]["caption_frames"] = embedded["mechanism"]["caption_frames"]
    p["adapt"]["variants"]["caption_mlm"]["epochs"] = embedded["adapt"]["variants"]["caption_mlm"]["epochs"]
    assert p == {**embedded, "profile": p["profile"]}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_study_s_seeds_are_refused_before_any_work(seed, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["mechanism_ladder.py", "--project", str(tmp_path / "none"), "--work",
                                      str(tmp_path / "work"), "--set", f"mechanism.seed={seed}"])
    with pytest.raises(SystemExit, match=f"mechanism.seed {seed} is one of the study's seeds"):
        ladder().main()
    assert not (tmp_path / "work").exists()


def test_without_a_seed_lever_it_reads_the_tuning_seed_whatever_params_yaml_holds(tmp_path, monkeypatch):
    """The embedded profile holds the study's seed once version 2 is committed: the script must not read it."""
    monkeypatch.setattr(sys, "argv", ["mechanism_ladder.py", "--project", str(tmp_path / "none"), "--work",
                                      str(tmp_path / "work")])
    with pytest.raises(SystemExit, match="is missing: run an embedded `dvc repro`"):  # past the seed check
        ladder().main()
    assert "seed: 100" in (tmp_path / "work" / "params.yaml").read_text()
