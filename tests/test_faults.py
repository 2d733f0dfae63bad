"""Faults: damaged checkpoints and parquet files, a full disk, a killed write.

The campaign (tools/faults.py) kills stages at random moments, damages their inputs and fills the disk on
the micro profile; its full form is run by hand (docs/reproducibility.md), its short form in
tests/test_pipeline.py, on the project the end-to-end test reproduced.
"""
import errno
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from xdbert import io, stage, training
from xdbert.errors import PipelineError


def flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_not_trained_on(tmp_path):
    path = tmp_path / "c.pt"
    state = {"model": {"w": torch.arange(50_000, dtype=torch.float32)}, "step": 3, "history": [{"loss": 1.0}]}
    training.save_checkpoint(path, state, "fp")
    loaded = training.load_checkpoint(path, "fp")
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert training.load_checkpoint(path, "other settings") is None  # starts afresh, as before

    flip(path)  # inside the tensor's bytes: torch.load alone reads it without complaint
    with pytest.raises(PipelineError, match=r"c.pt is damaged: its contents do not match.*delete it"):
        training.load_checkpoint(path, "fp")
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PipelineError, match=r"c.pt is damaged or from another torch version"):
        training.load_checkpoint(path, "fp")


def test_parquet_pages_carry_checksums(tmp_path):
    path = tmp_path / "t.parquet"
    table = pa.table({"idx": list(range(2000)), "text": [f"sentence number {i}" for i in range(2000)]})
    io.write_parquet(table, path)
    assert io.read_parquet(path, "rerun it").equals(table)
    flip(path, 0.3)  # inside a data page
    with pytest.raises(PipelineError, match=r"t.parquet is damaged .*: rerun it"):
        io.read_parquet(path, "rerun it")
    with pytest.raises(PipelineError, match=r"missing file .*nothing.parquet: rerun it"):
        io.read_parquet(tmp_path / "nothing.parquet", "rerun it")


def test_a_killed_writes_leftovers_go_with_the_next_write(tmp_path):
    target = tmp_path / "table1.md"
    (tmp_path / ".table1.md.abc123.tmp").mkdir()  # what a SIGKILL between write and rename leaves
    (tmp_path / ".table1.md.abc123.tmp" / "table1.md").write_text("half")
    (tmp_path / ".table2.md.def456.tmp").mkdir()  # another target's: not this write's business
    io.write_text(target, "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".table2.md.def456.tmp", "table1.md"]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device", "reports/table1.md"),
                                   RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed")])
def test_a_full_disk_is_one_line_and_exit_2(error, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stages/aggregate.py"])

    def main():
        raise error

    with pytest.raises(SystemExit) as e:
        stage.run(main)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: the disk is full")


def test_other_errors_keep_their_traceback(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stages/aggregate.py"])

    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        stage.run(main)
