"""AdamW parameter groups with the optional layer-wise learning-rate decay (`families.<name>.layer_lr_decay`)."""
from __future__ import annotations

import re

from torch import nn

_LAYER = re.compile(r"^(.*)\.(?:layer|resblocks)\.(\d+)\.")


def layer_depths(names: list[str]) -> dict[str, int]:
    """How far below the top each parameter sits: the basis of layer-wise learning-rate decay.

    Per stack of numbered layers (`<stack>.layer.N.` as in BERT/ELECTRA/RoBERTa, `<stack>.resblocks.N.`
    in CLIP), layer N of L has depth L - N: the top layer 1, layer 0 L. The stack's embeddings (any
    parameter with `embedding` in its name under the module that holds the stack) have depth L + 1.
    Everything else - task heads, poolers, the cross layers above the encoder, final LayerNorms - is
    depth 0 and keeps the full rate. In the full model the encoder and CLIP stacks count separately.
    """
    stacks: dict[str, int] = {}
    for name in names:
        m = _LAYER.match(name)
        if m:
            stacks[m.group(1)] = max(stacks.get(m.group(1), 0), int(m.group(2)) + 1)
    depths = {}
    for name in names:
        m = _LAYER.match(name)
        if m:
            depths[name] = stacks[m.group(1)] - int(m.group(2))
            continue
        depths[name] = 0
        parts = name.split(".")
        hit = next((i for i, p in enumerate(parts) if "embedding" in p), None)
        if hit is not None:
            owner = ".".join(parts[:hit])
            # the stack under the same module: `bert` holds `bert.encoder`, CLIP's tower holds `transformer`
            owned = [s for s in stacks if owner == "" or s == owner or s.startswith(owner + ".")]
            if owned:
                depths[name] = stacks[min(owned, key=len)] + 1
    return depths


def parameter_groups(model: nn.Module, lr: float, weight_decay: float, layer_lr_decay: float = 1.0) -> list[dict]:
    """AdamW groups: lr * layer_lr_decay ** depth, no weight decay on biases and LayerNorm weights.

    Parameters with the same rate and decay share a group, so without layer-wise decay there are two.
    The optimizer steps each group on its own (a fused kernel launch and its bookkeeping), which is
    host time in every step of a short GPU batch; AdamW updates each tensor alone, so the grouping
    changes no value."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    depths = layer_depths([n for n, _ in named])
    groups: dict[tuple[float, float], dict] = {}
    for name, p in named:
        key = (lr * layer_lr_decay ** depths[name], weight_decay if p.ndim >= 2 else 0.0)
        if key not in groups:
            groups[key] = {"params": [], "names": [], "lr": key[0], "weight_decay": key[1]}
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]
