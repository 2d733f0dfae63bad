"""Words that must be one token of an encoder's vocabulary: the mechanism study's attribute words, which its
upper reference sees masked more often (`adapt.attribute_mlm_prob`) and rung M asks for at a [MASK]
(xdbert.analysis.cloze). Apart from vocab.py, whose module the finetuning run cache hashes."""
from __future__ import annotations

from typing import Sequence


def single_ids(tok, words: Sequence[str], what: str) -> list[int]:
    """Each of `words` as its one token id in `tok`'s vocabulary (ValueError naming a word that is not one token)."""
    ids = []
    for w in words:
        pieces = tok.tokenize(w)
        if len(pieces) != 1 or pieces[0] == tok.unk_token:
            raise ValueError(f"the {what} {w!r} is the tokens {pieces} in the encoder's vocabulary: one token is needed")
        ids.append(tok.convert_tokens_to_ids(pieces[0]))
    return ids
