"""How big a run is, read from its saved model: what the grid orders its runs by and sizes its workers with.

Neither decides a result, so an edit here keeps every saved run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def model_parameters(model_path: str | Path) -> int:
    """The parameters of a saved model, counted from the fp32 safetensors files the pipeline saves."""
    return sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors")) // 4


# A run reads a few rows of a token-embedding table per token, so the table takes memory but next to no
# compute: CLIP's 49,408 rows are 97% of the embedded CLIP stand-in and would make its runs look 30x dearer.
EMBEDDING_TABLES = ("word_embeddings.weight", "token_embedding.weight")


def compute_parameters(model_path: str | Path) -> int:
    """The parameters a run's compute grows with: a saved model's, less its token-embedding tables (read
    from the safetensors headers, no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for file in Path(model_path).glob("*.safetensors"):
        with safe_open(file, "np") as f:
            total += sum(int(np.prod(f.get_slice(name).get_shape())) for name in f.keys()
                         if not name.endswith(EMBEDDING_TABLES))
    return total
