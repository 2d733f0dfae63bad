"""Same inputs, same bytes, whatever the environment: every kind of folder the pipeline saves is written
in two processes whose environments differ the ways users' machines do (the hub switched off or on, another
HF_HOME, temporary directory and working-directory path, the C locale or a UTF-8 one), and compared byte
for byte. A saved file that recorded how it was loaded (transformers writes a tokenizer's load arguments
back into tokenizer_config.json) would change every stage after it in dvc.lock."""
from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
VARIED = (*OFFLINE, "HF_HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "LANGUAGE")
CLIP = "xdbert-tiny"
TINY_ENCODER = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                "max_position_embeddings": 64}
WORDS = "the a of to in on at with from river stone cloud table green small quiet early north paper good bad".split()


def params(encoder: str) -> dict:
    """The embedded profile at test sizes, with `encoder` as `model.encoder`."""
    from xdbert.profiles import values

    embedded = values("embedded")
    return {**embedded,
            "model": {**embedded["model"], "encoder": encoder, "clip": CLIP, "encoder_config": TINY_ENCODER},
            "tokenize": {**embedded["tokenize"], "vocab_size": 200, "max_len": 32, "n_blocks": 1, "shard_windows": 16,
                         "max_overflow": 0.01, "validate_windows": 4, "workers": 1}}


def write_every_kind(inputs: Path) -> None:
    """In the working directory, through the functions the stages call: `dual_tokenize`'s models/tokenizer and
    data/shards, from a pretrained encoder's tokenizer (a folder in the hub's format, the paper profile's path)
    and from a trained vocabulary (the embedded profile's, under embedded/); `pretrain_encoder`'s
    models/pretrain_encoder/bert (MLM model and tokenizer); `pretrain_clip`'s tower; `adapt`'s
    models/adapted/bert/x and models/crossmodal/bert/x. Sizes are tiny, the code paths the real ones."""
    import torch
    from transformers import AutoTokenizer

    from xdbert import paths
    from xdbert.adaptation.pretraining import save_masked_lm
    from xdbert.data.tokenization.build import Inputs, build
    from xdbert.model.clip_tower import CLIPTextTower
    from xdbert.model.encoders import build_masked_lm
    from xdbert.model.modeling import XDBertConfig, XDBertModel
    from xdbert.model.saving import load_clip_tower, save_adapted, save_clip_tower, save_full

    for encoder, root in ((str(inputs / "hub-bert"), Path(".")), ("random:bert", Path("embedded"))):
        got = Inputs.check(*Inputs.read(params(encoder)), inputs / "corpus")
        build(corpus_dir=inputs / "corpus", shard_dir=root / paths.SHARDS, tokenizer_dir=root / paths.TOKENIZER,
              encoder=got.encoder, clip_name=got.clip_name, settings=got.settings, positions=got.positions,
              encoder_tokenizer=got.encoder_tokenizer)

    tokenizer = AutoTokenizer.from_pretrained(str(paths.TOKENIZER))  # as stages/pretrain_encoder.py loads it
    torch.manual_seed(0)
    mlm = build_masked_lm("random:bert", TINY_ENCODER, vocab_size=len(tokenizer))
    save_masked_lm(mlm, tokenizer, paths.pretrain_encoder("bert"))

    torch.manual_seed(0)
    save_clip_tower(CLIPTextTower.build(CLIP), paths.PRETRAIN_CLIP, CLIP)

    tower, clip_config = load_clip_tower(paths.PRETRAIN_CLIP)  # as xdbert.model.build.build_xdbert starts a variant
    config = XDBertConfig(encoder=str(paths.pretrain_encoder("bert")), vocab_size=len(tokenizer), clip=CLIP, clip_heads=2,
                          cross_layers=1, clip_quick_gelu=clip_config["clip_quick_gelu"])
    torch.manual_seed(0)
    model = XDBertModel.build(config, clip=tower)
    save_adapted(model, paths.adapted("bert", "x"), tokenizer_dir=paths.TOKENIZER)
    save_full(model, paths.crossmodal("bert", "x"))


def write_inputs(folder: Path) -> Path:
    """A pretrained encoder's folder and a corpus, shared by both runs. The encoder is the rehearsal mirror's
    bert-base-uncased: the hub's file set (vocab.txt, tokenizer.json, tokenizer_config.json), tiny random weights."""
    from xdbert.mirror import write_encoder

    (folder / "hub-bert").mkdir(parents=True)
    write_encoder(folder / "hub-bert", "bert-base-uncased", "tiny", seed=0)
    (folder / "corpus").mkdir()
    for split, n in (("train", 24), ("valid", 6)):
        texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(5 + i % 9)) + "." for i in range(n)]
        pd.DataFrame({"doc_id": [f"{split}-{i}" for i in range(n)], "text": texts}).to_parquet(
            folder / "corpus" / f"{split}.parquet")
    return folder


def run_in(cwd: Path, inputs: Path, changes: dict[str, str]) -> dict[str, bytes]:
    """Every file `write_every_kind` writes when run in `cwd` in an environment with `changes` (the variables of
    VARIED not named there unset), by relative path."""
    cwd.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in VARIED} | changes
    for folder in (changes.get("HF_HOME"), changes["TMPDIR"]):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
            f"from test_environment_bytes import write_every_kind; write_every_kind(Path({str(inputs)!r}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {p.relative_to(cwd).as_posix(): p.read_bytes() for p in sorted(cwd.rglob("*")) if p.is_file()}


def differences(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """Each file only one side has, and each file whose bytes differ (text files with their changed lines)."""
    lines = [f"only in {side}: {name}" for side, this, other in (("A", a, b), ("B", b, a)) for name in sorted(set(this) - set(other))]
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            try:
                diff = difflib.unified_diff(a[name].decode().splitlines(), b[name].decode().splitlines(), "A", "B", n=0, lineterm="")
                lines.append(f"{name} differs:\n" + "\n".join(list(diff)[2:]))
            except UnicodeDecodeError:
                lines.append(f"{name} differs ({len(a[name])} and {len(b[name])} bytes)")
    return lines


@pytest.mark.slow  # two environments, each writing every kind of folder
def test_every_saved_folder_has_the_same_bytes_in_two_environments(tmp_path):
    inputs = write_inputs(tmp_path / "inputs")
    a = run_in(tmp_path / "a", inputs, {"LANG": "C.UTF-8", "TMPDIR": str(tmp_path / "tmp-a")})
    elsewhere = tmp_path / "somewhere else"
    b = run_in(elsewhere / "work" / "b", inputs, {**{k: "1" for k in OFFLINE}, "HF_HOME": str(elsewhere / "hf"),
                                                 "TMPDIR": str(elsewhere / "tmp"), "LANG": "C", "LC_ALL": "C"})
    kinds = {"models/tokenizer", "embedded/models/tokenizer", "data/shards", "embedded/data/shards",
             "models/pretrain_encoder/bert", "models/pretrain_clip", "models/adapted/bert/x", "models/crossmodal/bert/x"}
    assert {k for k in kinds if any(name.startswith(k + "/") for name in a)} == kinds  # every kind was written
    problems = differences(a, b)
    assert not problems, "the environment changed saved bytes:\n" + "\n".join(problems)
    # nor does any tokenizer record how it was loaded (from_pretrained's local_files_only, whether a folder was read)
    configs = {name: json.loads(data) for name, data in a.items() if name.endswith("tokenizer_config.json")}
    assert "models/pretrain_encoder/bert/tokenizer_config.json" in configs
    assert not {name: sorted({"local_files_only", "is_local"} & set(c)) for name, c in configs.items()
                if {"local_files_only", "is_local"} & set(c)}
