"""Rung M of the mechanism study's ladder (issue 68, ../shared/MECHANISM.md "Calibration"): has an encoder
memorized the facts? It is asked each object's fact with its own MLM head, at a [MASK] where the attribute
would stand, in frames no caption uses.

Facts a masked language model learned sit at the mask and in its head (Dai et al., Knowledge Neurons, 2022),
so the readout is the head's choice among the attribute words there, not a probe of the object's state. The
frames put the mask after the object and before it, as the captions do, but the two tokens on either side of
the mask occur around no caption's attribute (tests/test_world.py): a frame a caption used would test
recall of that caption, not of the fact.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from xdbert.analysis import mechanism_stats as S
from xdbert.data.synthetic.words import a
from xdbert.data.tokenization.word_ids import single_ids

MASK = "[MASK]"  # where the attribute goes; replaced by the tokenizer's own mask token
CLOZE_FRAMES = (
    "i think the {o} is [MASK] , right ?",
    "we all knew that {o} was mostly [MASK] underneath .",
    "from afar the {o} seemed [MASK] to us .",
    "we bought the last [MASK] {o} they had .",
    "she found her favourite [MASK] {o} yesterday .",
    "nobody wanted such a [MASK] {o} at home .",
)


def cloze_answers(model, tok, objects: Sequence[str], attributes: Sequence[str],
                  frames: Sequence[str] = CLOZE_FRAMES) -> np.ndarray:
    """(objects, frames) int: the index in `attributes` that `model`'s MLM head ranks first at the [MASK] of
    each frame filled with each object (`{o}`, and `{a_o}` its article).

    `model` is an `XDBertModel` with an MLM head and no cross layers (the baseline, the caption references:
    the head reads the encoder's own output there, as in training); `tok` its tokenizer. Only the attribute
    words compete: the question is which of them, not whether one.
    """
    import torch

    if getattr(model, "mlm_head", None) is None:
        raise ValueError("the cloze needs the model's own MLM head: load the whole model (`load_full`)")
    if model.config.uses_clip:
        raise ValueError("the cloze reads encoders without cross layers (their MLM head reads the encoder's output)")
    classes = torch.tensor(single_ids(tok, attributes, "attribute"))
    single_ids(tok, objects, "object")
    model.eval()
    out = np.zeros((len(objects), len(frames)), dtype=np.int64)
    with torch.no_grad():
        for i, obj in enumerate(objects):
            sentences = [f.format(o=obj, a_o=a(obj)).replace(MASK, tok.mask_token) for f in frames]
            batch = tok(sentences, return_tensors="pt", padding=True)
            at = batch["input_ids"] == tok.mask_token_id
            if not (at.sum(1) == 1).all():
                raise ValueError(f"each cloze frame must hold one {MASK}; got {sentences}")
            hidden = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            logits = model.mlm_head(hidden[at], classes)
            out[i] = logits.argmax(-1).numpy()
    return out


def caption_cloze_frames() -> tuple[str, ...]:
    """The captions' own frames (world.FRAMES_AFTER, FRAMES_BEFORE) with the [MASK] where the attribute stands and
    one filling of the other slots: what the references trained on, beside M's frames, which they did not."""
    from xdbert.data.synthetic.world import FRAMES_AFTER, FRAMES_BEFORE

    return tuple(f.format(o="{o}", a_o="{a_o}", x=MASK, a_x="a", s="old", p="man", a_p="a", w="in the park")
                 for f in FRAMES_AFTER + FRAMES_BEFORE)


def memorized(answers: np.ndarray, real: np.ndarray, twin: np.ndarray, level: float, n_flip: int,
              seed: int) -> dict:
    """Rung M's numbers from `answers` (objects, frames) and each object's `real` and `twin` attribute index:
    the real table's accuracy, the twin's, and per object real minus twin accuracy (over the frames), with
    the sign-flip interval over objects of its mean. A model that holds no fact answers the twin's table as
    often as the real one: the twin is the null."""
    answers = np.asarray(answers)
    real_right = (answers == np.asarray(real)[:, None]).mean(1)
    twin_right = (answers == np.asarray(twin)[:, None]).mean(1)
    values = real_right - twin_right
    low, high = S.sign_flip_interval(values, level, (-1.0, 1.0), n_flip, seed)
    return {"real_accuracy": float(real_right.mean()), "twin_accuracy": float(twin_right.mean()),
            "difference": S.Interval(float(values.mean()), low, high, S.method_of(len(values)))}
