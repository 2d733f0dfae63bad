"""How often each model of the mechanism study met each fact (issue 68): a null read beside a model that met its
facts too rarely to learn them says nothing, so the report states the exposures of every model that reads captions.

An exposure is one training target that states an object's own attribute: for the CLIP stand-in, a caption where the
attribute follows the object (a causal tower predicts it from the object's state; one before it is not predicted
from the object), read once per pass; for the caption references, a caption stating it, read once per pass, whose
attribute word is a masked target with the reference's rate. Passes are what the training read of the captions:
steps x batch x the captions' share of it, over the captions there are.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np


def statements(captions: Sequence[str], objects: Sequence[str], facts: dict[str, str], after_only: bool) -> np.ndarray:
    """Per object of `objects`, the captions that name it with its attribute in `facts` (object -> attribute); with
    `after_only`, only those where the attribute comes after the object."""
    index = {o: i for i, o in enumerate(objects)}
    counts = np.zeros(len(objects), dtype=np.int64)
    for caption in captions:
        words = re.findall(r"\w+", caption.lower())
        for position, word in enumerate(words):
            i = index.get(word)
            if i is None:
                continue
            where = [j for j, w in enumerate(words) if w == facts[word]]
            if where and (not after_only or max(where) > position):
                counts[i] += 1
    return counts


def passes(steps: int, batch_size: int, caption_share: float, n_captions: int) -> float:
    """How many times training read each caption block or window: steps x batch x share over the captions."""
    return steps * batch_size * caption_share / n_captions


def summary(per_object: np.ndarray) -> dict:
    """Mean, min and max over the objects, as the report prints them."""
    return {"mean": float(np.mean(per_object)), "min": float(np.min(per_object)), "max": float(np.max(per_object))}
