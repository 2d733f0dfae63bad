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


def shared_single_ids(tok, clip_tok, clip_ids: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """(encoder ids, CLIP ids) of the words that are one token in each vocabulary: `tok`'s whole-word tokens
    (no "##" piece, no special token) that `clip_tok` (`clip_bpe.clip_fast_tokenizer`) encodes as one token,
    in the encoder's id order. `clip_ids`: keep only words whose CLIP id is among these (the ids a tower was
    trained to predict)."""
    specials = set(tok.all_special_tokens)
    words = [(w, i) for w, i in sorted(tok.get_vocab().items(), key=lambda x: x[1])
             if w not in specials and not w.startswith("##") and w.isprintable() and w.strip() == w and w]
    encoded = [e.ids for e in clip_tok.encode_batch([w for w, _ in words], add_special_tokens=False)]
    allowed = None if clip_ids is None else set(int(c) for c in clip_ids)
    pairs = [(i, c[0]) for (_, i), c in zip(words, encoded) if len(c) == 1 and (allowed is None or c[0] in allowed)]
    return [i for i, _ in pairs], [c for _, c in pairs]
