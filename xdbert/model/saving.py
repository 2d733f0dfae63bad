"""Saving and loading: the CLIP text tower alone, the adapted language encoder alone, the whole model.

- `save_clip_tower` / `load_clip_tower`: the `pretrain_clip` stage's output (the tower adaptation starts
  from) and the `clip` finetuning kind's input: clip_config.json + model.safetensors.
- `save_adapted`: the language encoder after adaptation, a plain `save_pretrained` folder (XDBERT itself).
- `save_full` / `load_full`: the whole cross-modal model (Table 8 finetunes it), byte-stable.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel

from xdbert.errors import PipelineError
from xdbert.io import atomic_path, check_safetensors, read_json, write_json
from xdbert.model.clip_tower import CLIPTextTower, clip_uses_quick_gelu
from xdbert.model.files import CLIP_CONFIG, CROSSMODAL_CONFIG
from xdbert.model.modeling import XDBertConfig, XDBertModel

ENCODER_CONFIG_DIR = "encoder"
WEIGHTS_FILE = "model.safetensors"

CLIP_WEIGHTS_FILE = "model.safetensors"  # a saved CLIP text tower's weights, beside CLIP_CONFIG


def save_clip_tower(tower: nn.Module, directory: str | Path, clip: str, clip_pretrained: str = "") -> Path:
    """Write a CLIP text tower (the `pretrain_clip` stage's output, the `clip` finetuning kind's input):
    clip_config.json + model.safetensors.

    The config records the activation the tower was built with (from the pretrained tag), so the reader
    rebuilds the same one before loading the weights.
    """
    from safetensors.torch import save_model

    clip_quick_gelu = clip_uses_quick_gelu(clip, clip_pretrained)
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        write_json(tmp / CLIP_CONFIG, {"clip": clip, "clip_pretrained": clip_pretrained, "clip_quick_gelu": clip_quick_gelu})
        save_model(tower, str(tmp / CLIP_WEIGHTS_FILE))
    return Path(directory)


def load_clip_tower(directory: str | Path) -> tuple[CLIPTextTower, dict]:
    """(tower, config) from a folder written by `save_clip_tower`; the weights come from the folder."""
    from safetensors.torch import load_model

    directory = Path(directory)
    if not (directory / CLIP_CONFIG).is_file():
        raise PipelineError(f"{directory} is not a saved CLIP text tower (no {CLIP_CONFIG}): run `dvc repro pretrain_clip`")
    config = read_json(directory / CLIP_CONFIG)
    check_safetensors(directory / CLIP_WEIGHTS_FILE)
    tower = CLIPTextTower.build(config["clip"], "", config.get("clip_quick_gelu"))
    load_model(tower, str(directory / CLIP_WEIGHTS_FILE), strict=True)
    return tower, config


def save_adapted(model: XDBertModel, directory: str | Path, tokenizer_dir: str | Path) -> Path:
    """Write the adapted language encoder alone (XDBERT) as a `save_pretrained` folder with its tokenizer.

    `AutoModel.from_pretrained(directory)` then gives a plain encoder with the original parameter count.
    """
    tokenizer_dir = Path(tokenizer_dir)
    files = sorted(p for p in tokenizer_dir.iterdir() if p.is_file()) if tokenizer_dir.is_dir() else []
    if not files:
        raise PipelineError(f"tokenizer folder {tokenizer_dir} is missing or empty: run the dual_tokenize stage first (`dvc repro dual_tokenize`)")
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        model.encoder.save_pretrained(tmp)
        for f in files:
            if not (tmp / f.name).exists():  # the encoder's own config.json wins over a tokenizer file of that name
                shutil.copy2(f, tmp / f.name)
    return Path(directory)


def save_full(model: XDBertModel, directory: str | Path) -> Path:
    """Write the whole cross-modal model: config JSON, the encoder's transformers config, safetensors.

    The same weights always give the same bytes, so DVC sees an unchanged model as unchanged. The
    decoders tied to the embeddings are stored once, under the embedding's name, and without
    safetensors' `save_model` metadata: it names the dropped duplicates in a map whose order changes
    from run to run. `load_model` reties them from the model's own structure.
    """
    from safetensors.torch import save_file

    state, stored = {}, set()
    for name, tensor in model.state_dict().items():  # embeddings come before the heads tied to them
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in stored:
            stored.add(key)
            state[name] = tensor.contiguous()
    with atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / CROSSMODAL_CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        model.encoder.config.save_pretrained(tmp / ENCODER_CONFIG_DIR)
        save_file(state, str(tmp / WEIGHTS_FILE))
    return Path(directory)


def load_full(directory: str | Path, device: str | torch.device = "cpu") -> XDBertModel:
    """Rebuild a model written by `save_full`, exactly; nothing is downloaded."""
    from safetensors.torch import load_model

    directory = Path(directory)
    config_file = directory / CROSSMODAL_CONFIG
    try:
        config = XDBertConfig.from_dict(read_json(config_file)).validate()
    except ValueError as e:  # another version's config, or an edited one: the model code names no file
        raise PipelineError(f"{config_file}: {e}; rerun the stage that wrote it") from None
    read_json(directory / ENCODER_CONFIG_DIR / "config.json")  # there and valid, or a PipelineError naming it
    check_safetensors(directory / WEIGHTS_FILE)
    encoder = AutoModel.from_config(AutoConfig.from_pretrained(directory / ENCODER_CONFIG_DIR))
    clip = None
    if config.has_tower:
        clip = CLIPTextTower.build(config.clip, "", config.clip_quick_gelu)  # weights come from the file
    model = XDBertModel(config, encoder, clip)
    load_model(model, str(directory / WEIGHTS_FILE), strict=True)  # strict: a missing tensor is an error
    return model.to(device)
