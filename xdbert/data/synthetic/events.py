"""Events and how sentences state them: the meaning representation behind the task stand-ins.

An `Event` says who did what to which coloured object where (how many, in which year). The task
generators build every example from events and render them with the templates here, so each label is
TRUE of its text: `say` states a whole event, `subfacts` what it entails, `contradiction` and
`negated_subfacts` what it rules out, `neutral` what it leaves open.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from xdbert.data.synthetic.words import (
    COLOURS, NUMBERS, OBJECTS, PERSONS, PLACES, REASONS, RELATIVES, SIZES, TIMES, VERB_SYNONYMS, Noun, Person,
    Place, Verb, a, cap, verbs_for,
)

Row = tuple  # (text_a, text_b | None, choices | None, label)

# Verbs chosen for events: one of each synonym pair, so two different events never differ only by
# a synonym (the other member appears through `reword`).
_SYNONYM_PARTNERS = set(VERB_SYNONYMS.values())


def number_word(n: int) -> str:
    """2..12 as a word ("two" .. "twelve")."""
    return NUMBERS[n - 2]


def event_verbs(obj: Noun) -> list[Verb]:
    """Verbs for events about `obj`: no synonym partners, and no states ("held", "watched") whose
    passives read oddly in the templates."""
    return [v for v in verbs_for(obj) if v.base not in _SYNONYM_PARTNERS and v.base not in ("watch", "hold")]


# ---------------------------------------------------------------------------------------------
# Events and how they are said
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    subj: Person
    verb: Verb
    colour: str
    obj: Noun
    place: Place
    count: int = 1          # 1: "the red car"; n > 1: "three red cars"
    year: int | None = None

    def np(self, det: str = "the", colour: bool = True) -> str:
        c = f"{self.colour} " if colour else ""
        if self.count > 1:
            return f"{number_word(self.count)} {c}{self.obj.plural}"
        return f"{det} {c}{self.obj.sing}"

    @property
    def be(self) -> str:
        return "were" if self.count > 1 else "was"

    @property
    def where(self) -> str:
        return f"{self.place.prep} the {self.place.name}"


SLOTS = ("subj", "verb", "colour", "obj", "place")


def random_event(rng: random.Random, objects: list[Noun] = OBJECTS, *, year_p: float = 0.0, count_p: float = 0.0) -> Event:
    obj = rng.choice(objects)
    return Event(
        subj=rng.choice(PERSONS), verb=rng.choice(event_verbs(obj)), colour=rng.choice(COLOURS), obj=obj,
        place=rng.choice(PLACES), count=rng.randint(2, 9) if rng.random() < count_p else 1,
        year=rng.randint(1850, 2015) if rng.random() < year_p else None,
    )


def change(ev: Event, slot: str, rng: random.Random, objects: list[Noun] = OBJECTS) -> Event:
    """`ev` with `slot` set to a different value that really changes the meaning (never a synonym);
    a new object comes from `objects`."""
    if slot == "subj":
        return replace(ev, subj=rng.choice([p for p in PERSONS if p != ev.subj]))
    if slot == "verb":
        return replace(ev, verb=rng.choice([v for v in event_verbs(ev.obj) if v != ev.verb]))
    if slot == "colour":
        return replace(ev, colour=rng.choice([c for c in COLOURS if c != ev.colour]))
    if slot == "obj":
        # the new object must still go with the verb (no "threw the car")
        objs = [o for o in objects if o != ev.obj and ev.verb in verbs_for(o)]
        return replace(ev, obj=rng.choice(objs))
    if slot == "place":
        return replace(ev, place=rng.choice([p for p in PLACES if p != ev.place]))
    if slot == "count":
        return replace(ev, count=rng.choice([n for n in range(2, 10) if n != ev.count]))
    if slot == "year":
        return replace(ev, year=other_year(ev.year or 1900, rng))
    raise ValueError(slot)


def other_year(y: int, rng: random.Random) -> int:
    """A different year, 3-40 years away, never after 2020 (the texts report the past)."""
    d = rng.randint(3, 40)
    return y - d if y + d > 2020 or rng.random() < 0.5 else y + d


STYLES = ("active", "active_front", "passive", "passive_front")


def say(ev: Event, style: str, negated: bool = False, extra: str = "") -> str:
    """One sentence stating all of `ev` (voice and word order set by `style`).

    `negated` states that the event did not happen; `extra` (" because ...") is appended information.
    """
    when = f" in {ev.year}" if ev.year else ""
    did = f"did not {ev.verb.base}" if negated else ev.verb.past
    was = f"{ev.be} not" if negated else ev.be
    if style == "active":
        s = f"the {ev.subj.sing} {did} {ev.np()} {ev.where}{when}{extra}."
    elif style == "active_front":
        s = f"{ev.where}{when}, the {ev.subj.sing} {did} {ev.np()}{extra}."
    elif style == "passive":
        s = f"{ev.np()} {was} {ev.verb.pp} by the {ev.subj.sing} {ev.where}{when}{extra}."
    elif style == "passive_front":
        s = f"{ev.where}{when}, {ev.np()} {was} {ev.verb.pp} by the {ev.subj.sing}{extra}."
    else:
        raise ValueError(style)
    return cap(s)


def extra_info(ev: Event, rng: random.Random) -> str:
    """A phrase adding a fact about `ev` that a sentence without it does not state."""
    pos = "his" if ev.subj.pron == "he" else "her"
    return rng.choice([f" because {rng.choice(REASONS)}", f" for {pos} {rng.choice(RELATIVES)}",
                       f" early in the {rng.choice(TIMES)}", " after a long day"])


def two_styles(rng: random.Random) -> tuple[str, str]:
    s1 = rng.choice(STYLES)
    return s1, rng.choice([s for s in STYLES if s != s1])


# ---------------------------------------------------------------------------------------------
# Sub-facts: what a premise entails, and the ways to contradict it
# ---------------------------------------------------------------------------------------------

def subfacts(ev: Event) -> list[str]:
    """Sentences that follow from `say(ev, ...)` (each keeps part of the event, adds nothing)."""
    obj = f"{number_word(ev.count)} {ev.obj.plural}" if ev.count > 1 else f"{a(ev.obj.sing)} {ev.obj.sing}"
    the_obj = f"the {ev.obj.plural}" if ev.count > 1 else f"the {ev.obj.sing}"
    out = [
        f"The {ev.subj.sing} {ev.verb.past} {obj}.",
        f"{cap(the_obj)} {ev.be} {ev.colour}.",
        f"The {ev.subj.sing} was {ev.where}.",
        f"{cap(obj)} {ev.be} {ev.verb.pp} {ev.where}.",
        f"The {ev.subj.sing} {ev.verb.past} {ev.np(det='a')}.",
    ]
    if ev.year:
        out.append(f"The {ev.subj.sing} {ev.verb.past} {obj} in {ev.year}.")
    return out


def negated_subfacts(ev: Event) -> list[str]:
    """Sentences that contradict `ev` by negating one of its sub-facts."""
    the_obj = f"the {ev.obj.plural}" if ev.count > 1 else f"the {ev.obj.sing}"
    return [
        f"The {ev.subj.sing} did not {ev.verb.base} {the_obj}.",
        f"{cap(the_obj)} {'were' if ev.count > 1 else 'was'} not {ev.colour}.",
        f"Nobody {ev.verb.past} {the_obj} {ev.where}.",
    ]


def contradiction(ev: Event, rng: random.Random) -> str:
    """A hypothesis that cannot be true of the same event: another colour, number, year or place, or a negation."""
    options = ["colour", "place", "negation"] + (["count"] if ev.count > 1 else []) + (["year"] if ev.year else [])
    kind = rng.choice(options)
    if kind == "negation":
        return rng.choice(negated_subfacts(ev))
    other = change(ev, kind, rng)
    the_obj = f"the {ev.obj.plural}" if ev.count > 1 else f"the {ev.obj.sing}"
    if kind == "colour":
        return rng.choice([f"{cap(the_obj)} {ev.be} {other.colour}.", f"The {ev.subj.sing} {ev.verb.past} {other.np()}."])
    if kind == "place":
        return f"The {ev.subj.sing} {ev.verb.past} {the_obj} {other.where}."
    if kind == "count":
        return f"The {ev.subj.sing} {ev.verb.past} {number_word(other.count)} {ev.obj.plural}."
    return f"The {ev.subj.sing} {ev.verb.past} {the_obj} in {other.year}."


def neutral(ev: Event, rng: random.Random) -> str:
    """A hypothesis the premise neither entails nor contradicts: it adds an unsettled fact."""
    the_obj = f"the {ev.obj.plural}" if ev.count > 1 else f"the {ev.obj.sing}"
    pos = "his" if ev.subj.pron == "he" else "her"
    return rng.choice([
        f"The {ev.subj.sing} {ev.verb.past} {the_obj} for {pos} {rng.choice(RELATIVES)}.",
        f"The {ev.subj.sing} {ev.verb.past} {the_obj} because {rng.choice(REASONS)}.",
        f"{cap(the_obj)} {ev.be} {rng.choice(SIZES)}.",
        f"The {ev.subj.sing} {ev.verb.past} {the_obj} in the {rng.choice(TIMES)}.",
        f"The {ev.subj.sing} was happy to be {ev.where}.",
        f"The {ev.subj.sing} had never been {ev.where} before.",
    ])
