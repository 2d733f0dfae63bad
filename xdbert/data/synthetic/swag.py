"""Generated stand-in for SWAG (embedded profile): one of four endings fits what the context's
object affords (`AFFORDANCES`); the three others are what objects of other kinds are for."""
from __future__ import annotations

import random
import re

from xdbert.data.synthetic.events import Row
from xdbert.data.synthetic.words import AFFORDANCES, COLOURS, OBJECTS, PERSONS, PLACES, Noun, a, cap


def gen_swag(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """Context: someone gets an object; the gold ending (at index `label`) is what that object is for,
    the three others are what objects of other kinds are for (all among `objects`)."""
    names = {o.sing for o in objects}
    # in AFFORDANCES' order, whatever the order of `objects`: the draws below depend on it
    affordances = {o: v for o, v in AFFORDANCES.items() if o in names}
    group_of = {o: g for o, (g, _) in affordances.items()}
    obj = rng.choice([o for o in objects if o.sing in affordances])
    person, colour, place = rng.choice(PERSONS), rng.choice(COLOURS), rng.choice(PLACES)
    get = rng.choice(["picks up", "finds", "is given", "buys", "takes out"])
    context = f"The {person.sing} {get} {a(colour)} {colour} {obj.sing} {place.prep} the {place.name}."
    start = cap(person.pron) if rng.random() < 0.6 else f"The {person.sing}"
    group = group_of[obj.sing]
    others = sorted({g for g in group_of.values() if g != group})
    wrong_groups = rng.sample(others, 3)
    wrong = [rng.choice([p for o, (g, ps) in affordances.items() if g == wg for p in ps]) for wg in wrong_groups]
    endings = wrong[:label] + [rng.choice(AFFORDANCES[obj.sing][1])] + wrong[label:]
    if rng.random() < 0.5:  # name the object instead of "it" in every ending
        endings = [re.sub(r"\bit\b", f"the {obj.sing}", e, count=1) for e in endings]
    return context, start, [e + "." for e in endings], label
