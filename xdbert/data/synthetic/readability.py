"""Generated stand-in for READ, CommonLit readability (embedded profile).

The target is a fixed function of real readability features (words per sentence, characters per
word, share of rare words) plus small noise, as CommonLit's targets track text difficulty.
"""
from __future__ import annotations

import random
import re

from xdbert.data.synthetic.events import Row, random_event
from xdbert.data.synthetic.words import (
    ABSTRACT_NOUNS, ABSTRACT_VERB, ANIMALS, INTRANSITIVE, PERSONS, RARE_ADJS, RARE_ADVS, RARE_CONNECTIVES,
    OBJECTS, RARE_NOUNS, RARE_VERBS, RARE_WORDS, REASONS, SETTLEMENTS, Noun, a, cap,
)

# what people do to ideas and predicaments (READ's long clauses)
_CLAUSE_VERBS = [ABSTRACT_VERB[b] for b in ("study", "discuss", "consider", "describe", "explain", "challenge")]


# READ: the target is this function of the passage's features (plus noise); CommonLit's scale.
READ_NOISE = 0.1


def readability_features(text: str) -> dict[str, float]:
    """Words per sentence, characters per word, share of rare words (the drivers of READ's target)."""
    sentences = [s for s in re.split(r"[.!?]+", text) if s.strip()]
    words = re.findall(r"[A-Za-z']+", text)
    return {
        "words_per_sentence": len(words) / max(1, len(sentences)),
        "chars_per_word": sum(len(w) for w in words) / max(1, len(words)),
        "rare_share": sum(w.lower() in RARE_WORDS for w in words) / max(1, len(words)),
    }


def readability_target(f: dict[str, float]) -> float:
    """Easier text scores higher, as in CommonLit (about -3.5 hardest .. +1.5 easiest)."""
    return 0.6 - 0.07 * (f["words_per_sentence"] - 6.0) - 0.75 * (f["chars_per_word"] - 4.0) - 6.0 * f["rare_share"]


_RARE_CONCRETE_VERBS = [v for v in RARE_VERBS if v.base in ("contemplate", "scrutinize")]


def _read_sentence(rng: random.Random, d: float, objects: list[Noun]) -> str:
    """One sentence of a passage of difficulty d in [0, 1]: longer clauses and rarer words as d grows."""
    if rng.random() > d + 0.15:  # short and plain
        ev = random_event(rng, objects)
        animal, v = rng.choice(ANIMALS), rng.choice(INTRANSITIVE)
        return rng.choice([f"The {animal.sing} {v.past}.", f"It was {ev.colour}.", f"The {ev.subj.sing} had {a(ev.obj.sing)} {ev.obj.sing}.",
                           f"The {ev.subj.sing} {ev.verb.past} it.", f"We {v.past} {ev.where}.", f"The {ev.obj.sing} was {ev.colour}."])
    ev = random_event(rng, objects, year_p=d * 0.5)
    adj = f"{rng.choice(RARE_ADJS)} " if rng.random() < d * 0.8 else ""
    adv = f"{rng.choice(RARE_ADVS)} " if rng.random() < d * 0.6 else ""
    verb = rng.choice(_RARE_CONCRETE_VERBS) if rng.random() < d * 0.4 else ev.verb
    s = f"the {adj}{ev.subj.sing} {adv}{verb.past} the {ev.colour} {ev.obj.sing} {ev.where}"
    if rng.random() < d:
        rare = rng.random() < d
        v = rng.choice(RARE_VERBS if rare else _CLAUSE_VERBS)
        s += f", while the {rng.choice(PERSONS).sing} {v.past} the {rng.choice(RARE_NOUNS if rare else ABSTRACT_NOUNS)} of the {rng.choice(SETTLEMENTS)}"
    if rng.random() < d * 0.7:
        s += f", because {rng.choice(REASONS)}"
    if rng.random() < d * 0.5:
        s = f"{rng.choice(RARE_CONNECTIVES)}, {s}"
    return cap(s) + "."


def gen_read(rng: random.Random, label: None = None, objects: list[Noun] = OBJECTS) -> Row:
    """A passage of 4-8 sentences at a random difficulty; target = readability_target(features) + noise."""
    d = rng.random()
    text = " ".join(_read_sentence(rng, d, objects) for _ in range(rng.randint(4, 8)))
    target = readability_target(readability_features(text)) + rng.gauss(0.0, READ_NOISE)
    return text, None, None, round(target, 4)
