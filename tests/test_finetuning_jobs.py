"""Preparing a job (xdbert.finetuning.control.prepare): its model and tokenizer folders are checked, and read once."""
from __future__ import annotations

import shutil

import pytest

from keyword_tasks import keyword_tables, settings
from xdbert.data.tasks.registry import get_task
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import keys
from xdbert.finetuning.control.prepare import prepare

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_model_folder_is_read_once_for_every_task(bert_dir, tmp_path, monkeypatch):
    """The stage prepares one job per (model, task): each model file is hashed once, and again only once
    it changes."""
    keys.code_digest()  # the code's files are hashed once per process anyway
    reads, sha256_file = [], keys.sha256_file
    monkeypatch.setattr(keys, "sha256_file", lambda path: reads.append(path.name) or sha256_file(path))
    keys._file_digest.cache_clear()
    model = tmp_path / "model"
    shutil.copytree(bert_dir, model)
    files = sorted(p.name for p in model.rglob("*") if p.is_file())
    first = [prepare("encoder", model, keyword_tables(task, 8, 4), settings(get_task(task))) for task in ("sst2", "stsb")]
    assert sorted(reads) == files and first[0].identity != first[1].identity
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    again = prepare("encoder", model, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    assert reads[len(files):] == ["config.json"] and again.identity != first[0].identity


def test_a_tokenizer_folder_without_its_vocabulary_is_refused(bert_dir, tmp_path):
    """transformers loads such a folder as a tokenizer of the special tokens alone, and every word would
    read as [UNK]: the run would train and score on nothing, and exit 0."""
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer

    model = tmp_path / "model"
    shutil.copytree(bert_dir, model)
    for name in ("tokenizer.json", "vocab.txt"):
        (model / name).unlink(missing_ok=True)
    with pytest.raises(PipelineError, match=f"{model} holds no vocabulary .* rerun the stage that writes it"):
        prepare("encoder", model, keyword_tables("sst2", 8, 4), settings(get_task("sst2")))
    with pytest.raises(PipelineError, match="holds no vocabulary"):
        load_encoder_tokenizer(str(model))


def test_a_max_len_past_the_encoders_positions_is_refused_before_any_training(bert_dir):
    with pytest.raises(PipelineError, match="`finetune.max_len: 100` is longer than the 64 positions .* at most 64"):
        prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2"), max_len=100))
    assert prepare("encoder", bert_dir, keyword_tables("sst2", 8, 4), settings(get_task("sst2"), max_len=64)).identity
