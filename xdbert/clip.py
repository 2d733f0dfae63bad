"""CLIP through open_clip: model configs this package adds, and CLIP's BPE tokenizer."""
from __future__ import annotations

import os
from pathlib import Path

import open_clip
from open_clip.tokenizer import SimpleTokenizer

from xdbert.errors import PipelineError

CONFIG_DIR = Path(__file__).parent / "resources"
_registered = False


def register_configs() -> None:
    """Make `xdbert-tiny` (the embedded profile's small CLIP) known to open_clip by name."""
    global _registered
    if not _registered:
        open_clip.add_model_config(CONFIG_DIR)
        _registered = True


def check_name(name: str) -> str:
    register_configs()
    known = open_clip.list_models()
    if name not in known:
        close = [m for m in known if "ViT-B" in m][:6]
        raise PipelineError(f"unknown CLIP model `model.clip: {name}`; use an open_clip name such as xdbert-tiny, {', '.join(close)} (open_clip.list_models() lists all)")
    return name


def clip_weights_repo(name: str, pretrained: str) -> str | None:
    """The hub repository open_clip downloads `name`'s `pretrained` weights from (None: a file, or none)."""
    if not pretrained or Path(pretrained).is_file():
        return None
    register_configs()
    hf_hub = open_clip.get_pretrained_cfg(name, pretrained).get("hf_hub", "")
    if not hf_hub:
        raise PipelineError(f"open_clip serves `{name}` / `{pretrained}` only by URL, not from the hub: download the "
                            f"checkpoint and give its path as `model.clip_pretrained`")
    return os.path.split(hf_hub)[0]  # open_clip's convention: `org/name/` or `org/name/file`


def pinned_clip_weights(name: str, pretrained: str) -> str:
    """The checkpoint file of tag `pretrained` in its snapshot pinned by hub.lock.json (`xdbert fetch`), or
    `pretrained` as it is where nothing pins it (open_clip then downloads the hub's current one)."""
    from xdbert.hub import pinned, source

    repo = clip_weights_repo(name, pretrained)
    if repo is None or pinned(repo) is None:
        return pretrained
    folder = Path(source(repo))
    filename = os.path.split(open_clip.get_pretrained_cfg(name, pretrained)["hf_hub"])[1] or "open_clip_pytorch_model.bin"
    # open_clip prefers a safetensors file beside the pickled one
    safe = "open_clip_model.safetensors" if filename == "open_clip_pytorch_model.bin" else Path(filename).stem + ".safetensors"
    for candidate in (safe, filename):
        if (folder / candidate).is_file():
            return str(folder / candidate)
    raise PipelineError(f"the pinned snapshot {folder} of `{repo}` holds neither {safe} nor {filename}: run `xdbert fetch` again")


def clip_tokenizer(name: str) -> SimpleTokenizer:
    """The reference CLIP tokenizer for open_clip model `name`; only CLIP's own BPE is supported."""
    tok = open_clip.get_tokenizer(check_name(name))
    if not isinstance(tok, SimpleTokenizer):
        raise PipelineError(f"`model.clip: {name}` uses {type(tok).__name__}, not CLIP's BPE SimpleTokenizer; choose a CLIP-BPE model such as ViT-B-32")
    return tok


def clip_special_ids(name: str) -> tuple[int, int]:
    """(start-of-text, end-of-text) ids of CLIP model `name`'s tokenizer (49406, 49407 for CLIP's BPE)."""
    tok = clip_tokenizer(name)
    return tok.sot_token_id, tok.eot_token_id


def clip_block_mask(clip_ids: "torch.Tensor", eot_id: int) -> "torch.Tensor":
    """Which positions of CLIP blocks hold real tokens: (..., context) ids -> (..., context) bool.

    A used block is [SOT] content [EOT] followed by zeros; an unused block is all zeros. Id 0 is a
    real token ("!"), so padding cannot be found by `== 0`: a position is valid when it is at or
    before the block's first end token, and a block without an end token is unused (all False).
    """
    import torch

    is_eot = clip_ids == eot_id
    has_eot = is_eot.any(dim=-1, keepdim=True)
    eot_pos = is_eot.to(torch.int8).argmax(dim=-1, keepdim=True)  # first EOT of the block
    positions = torch.arange(clip_ids.shape[-1], device=clip_ids.device)
    return (positions <= eot_pos) & has_eot
