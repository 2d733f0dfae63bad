"""The embedded profile's adaptation corpus (`generate_corpus`): generated articles, each about a small
setting, cast and set of props, in the words of `xdbert.data.synthetic.words`."""
from __future__ import annotations

import random

from xdbert.data.synthetic.words import (
    ABSTRACT_ADJS, ABSTRACT_NOUNS, ABSTRACT_VERBS, AFFORDANCES, ANIMALS, ASPECTS, COLOURS, FACILITIES, INSTITUTIONS,
    INTRANSITIVE, NEGATIVE, NEGATIVE_VERBS, NUMBERS, OBJECTS, PERSONS, PLACES, POSITIVE, POSITIVE_VERBS, RARE_ADJS,
    RARE_ADVS, RARE_CONNECTIVES, RARE_NOUNS, RARE_VERBS, REASONS, RELATIVES, REVIEWED, SETTLEMENTS, SIZES, TIMES,
    VERB, Noun, Person, Verb, a, cap, reword, verbs_for,
)
from xdbert.errors import PipelineError


# The share of sentences that are pattern sentences, when `generate_corpus` is given pattern words.
PATTERN_RATE = 0.02


def year(rng: random.Random) -> int:
    """A year the texts report (1850-2015)."""
    return rng.randint(1850, 2015)


class _Document:
    """One generated article: a setting, a cast and some props that every sentence draws on.

    Reusing the same few people, objects and their colours across thirty sentences is what makes the
    text coherent: a masked noun or colour can be recovered from an earlier mention, the kind of
    long-range evidence MLM on real articles provides.
    """

    def __init__(self, rng: random.Random, objects: list[Noun] = OBJECTS, patterns: tuple[str, ...] = ()):
        self.rng = rng
        self.patterns = patterns
        self.place = rng.choice(PLACES)
        self.places = rng.sample(PLACES, 3)
        self.cast = rng.sample(PERSONS, 3)
        self.props = rng.sample(objects, 4)
        self.colour = {o.sing: rng.choice(COLOURS) for o in self.props}
        self.size = {o.sing: rng.choice(SIZES) for o in self.props}
        self.animal = rng.choice(ANIMALS)
        self.animal_colour = rng.choice(COLOURS)
        self.year = year(rng)
        self.institution = rng.choice(INSTITUTIONS)
        self.themes = rng.sample(ABSTRACT_NOUNS, 3)
        self.reviewed = rng.choice(REVIEWED)
        self.tone = rng.random() < 0.5
        self.events: list[tuple[Person, Verb, Noun, str]] = []  # said so far, for restatements

    # --- pieces -------------------------------------------------------------------------------
    def person(self) -> Person:
        return self.rng.choice(self.cast)

    def prop(self) -> Noun:
        return self.rng.choice(self.props)

    def np(self, obj: Noun, det: str = "the") -> str:
        if det in ("a", "an"):
            return f"{a(self.colour[obj.sing])} {self.colour[obj.sing]} {obj.sing}"
        r = self.rng.random()
        if r < 0.5:
            return f"{det} {self.colour[obj.sing]} {obj.sing}"
        if r < 0.7:
            return f"{det} {self.size[obj.sing]} {obj.sing}"
        return f"{det} {obj.sing}"

    def where(self) -> str:
        p = self.place if self.rng.random() < 0.6 else self.rng.choice(self.places)
        return f"{p.prep} the {p.name}"

    # --- sentence templates -------------------------------------------------------------------
    def active(self) -> str:
        o, p = self.prop(), self.person()
        v = self.rng.choice(verbs_for(o))
        where = self.where()
        self.events.append((p, v, o, where))
        lead = self.rng.choice(["", f"In {self.year}, ", f"One {self.rng.choice(TIMES)}, ", "Later, ", "Then "])
        return cap(f"{lead}the {p.sing} {v.past} {self.np(o)} {where}.")

    def passive(self) -> str:
        o, p = self.prop(), self.person()
        v = self.rng.choice(verbs_for(o))
        where = self.where()
        self.events.append((p, v, o, where))
        return cap(f"{self.np(o)} was {v.pp} by the {p.sing} {where}.")

    def restate(self) -> str:
        """An earlier event said again in other words: the same facts in another voice or a cleft."""
        if not self.events:
            return self.active()
        p, v, o, where = self.rng.choice(self.events)
        c = self.colour[o.sing]
        return self.rng.choice([
            f"So the {c} {o.sing} had been {v.pp} by the {p.sing} {where}.",
            f"It was the {p.sing} who {v.past} the {c} {o.sing} {where}.",
            f"The {o.sing} that the {p.sing} {v.past} {where} was {c}.",
            f"In short, the {p.sing} {v.past} the {c} {o.sing}.",
        ])

    def present(self) -> str:
        o, p = self.prop(), self.person()
        v = self.rng.choice(verbs_for(o))
        n = self.rng.choice(NUMBERS)
        return self.rng.choice([
            f"Every {self.rng.choice(TIMES)}, the {p.plural} {v.base} {n} {o.plural} {self.where()}.",
            f"Every {self.rng.choice(TIMES)}, the {p.sing} {v.s} {self.np(o)} {self.where()}.",
            f"The {p.sing} has {v.pp} {self.np(o)} {self.where()}.",
            f"The {p.plural} have {v.pp} {n} {o.plural} {self.where()}.",
            f"Now the {p.sing} is {v.ing} {self.np(o)} {self.where()}.",
            f"Now the {p.plural} are {v.ing} {self.np(o)} {self.where()}.",
            f"There is {a(self.colour[o.sing])} {self.colour[o.sing]} {o.sing} {self.where()}.",
            f"There are {n} {self.colour[o.sing]} {o.plural} {self.where()}.",
        ])

    def animal_present(self) -> str:
        v = self.rng.choice(INTRANSITIVE)
        return self.rng.choice([
            f"The {self.animal_colour} {self.animal.sing} {v.s} {self.where()} every {self.rng.choice(TIMES)}.",
            f"Some {self.animal.plural} {v.base} {self.where()} while the {self.person().sing} {self.rng.choice(INTRANSITIVE).s}.",
            f"The {self.animal.plural} are {v.ing} {self.where()}, and the {self.person().sing} is {self.rng.choice(INTRANSITIVE).ing}.",
        ])

    def letter(self) -> str:
        """First-person passages, like the letters and diaries quoted in articles."""
        o, rel = self.prop(), self.rng.choice(RELATIVES)
        v = self.rng.choice(verbs_for(o))
        season = self.rng.choice(["night", "weekend", "summer", "winter", "spring", "autumn", "year"])
        return self.rng.choice([
            f"\"Last {season} I {v.past} {self.np(o)} {self.where()}, and my {rel} helped me,\" wrote the {self.person().sing}.",
            f"\"My {rel} and I {v.past} {self.np(o, 'the')} {self.where()} last {season}.\"",
            f"\"We {self.rng.choice(INTRANSITIVE).past} {self.where()}, and nobody saw us.\"",
            f"\"I {v.past} the {o.sing} for my {rel}'s birthday; someone else paid for it.\"",
            f"\"I thought the {self.reviewed} was {self.rng.choice(POSITIVE if self.tone else NEGATIVE)},\" said the {self.person().sing}.",
            f"The {self.person().sing} was happy to be {self.where()}, and {self.person().pron} had never been there before.",
            f"The {self.person().sing} {v.past} the {o.sing} for {self.rng.choice(['his', 'her'])} {rel}, who lives {self.where()}.",
        ])

    def question(self) -> str:
        """Questions people ask in the text, of the kinds the question tasks use."""
        o, p = self.prop(), self.person()
        v = self.rng.choice(verbs_for(o))
        c = self.colour[o.sing]
        q = self.rng.choice([
            f"How do I {v.base} {a(o.sing)} {o.sing}?", f"What is the best way to {v.base} {a(o.sing)} {o.sing}?",
            f"How can I {v.base} my {o.sing}?", f"What is the easiest way to {v.base} {a(o.sing)} {o.sing}?",
            f"Where can I buy {a(c)} {c} {o.sing}?", f"Where is the best place to purchase {a(c)} {c} {o.sing}?",
            f"Which shop sells {c} {o.plural}?", f"Where do people buy {c} {o.plural}?",
            f"Why are so many {o.plural} {c}?", f"What is the reason that most {o.plural} are {c}?",
            f"Why do {o.plural} usually come in {c}?", f"Should I bring {a(o.sing)} {o.sing} to the {self.place.name}?",
            f"Is it a good idea to take {a(o.sing)} {o.sing} to the {self.place.name}?", f"Do I need {a(o.sing)} {o.sing} {self.where()}?",
            f"What can I do with an old {o.sing}?", f"How can I reuse an old {o.sing}?", f"What are good uses for an old {o.sing}?",
            f"In what year did the {p.sing} {v.base} the {o.sing}?", f"What colour was the {o.sing} that the {p.sing} {v.past}?",
            f"How many {o.plural} did the {p.sing} {v.base}?", f"Where did the {p.sing} {v.base} the {c} {o.sing}?",
        ])
        return self.rng.choice([f"\"{q}\" asked the {p.sing}.", f"The {p.sing} asked, \"{q}\""])

    def report(self) -> str:
        """Sentences in the register of council minutes and news reports."""
        f, town = self.rng.choice(FACILITIES), self.rng.choice(SETTLEMENTS)
        inst = self.institution
        return self.rng.choice([
            f"After a long debate about {self.themes[0]}, the {inst} of the {town} built {self.rng.choice(NUMBERS)} new {f.plural} in {self.year}.",
            f"The {f.plural} were paid for by the {self.rng.choice(INSTITUTIONS)}.",
            f"The {f.plural} cost more than the {inst} had planned.",
            f"Most people in the {town} supported the decision, but some did not.",
            f"There was no debate about {self.themes[1]}, and the {inst} did not close any {f.plural}.",
            f"The {inst} closed the old {f.sing} after a long debate about {self.themes[2]}.",
        ])

    def seeing(self) -> str:
        """What people get and take out: the openings of SWAG-like scenes."""
        o, p = self.prop(), self.person()
        return self.rng.choice([
            f"The {p.sing} is given {self.np(o, a(self.colour[o.sing]))} {self.where()}.",
            f"The {p.sing} takes out {self.np(o, 'the')} and {self.rng.choice(['smiles', 'waits', 'laughs'])}.",
            f"Everyone saw the {p.sing} with the {self.colour[o.sing]} {o.sing}.",
        ])

    def describe(self) -> str:
        o = self.prop()
        c, s = self.colour[o.sing], self.size[o.sing]
        return self.rng.choice([
            f"The {o.sing} was {c} and {s}.",
            f"Its {c} colour made the {o.sing} easy to see from the {self.place.name}.",
            f"There were {self.rng.choice(NUMBERS)} {c} {o.plural} {self.where()}.",
            f"The {s} {o.sing} belonged to the {self.person().sing}'s {self.rng.choice(RELATIVES)}.",
        ])

    def animal_scene(self) -> str:
        v = self.rng.choice(INTRANSITIVE)
        p = self.person()
        if self.rng.random() < 0.5:
            return f"A {self.animal_colour} {self.animal.sing} {v.past} {self.where()} while the {p.sing} {self.rng.choice(verbs_for(self.props[0])).past} {self.np(self.props[0])}."
        return f"The {self.animal.plural} {v.base} near the {self.place.name} and the {p.plural} {self.rng.choice(INTRANSITIVE).base} with them."

    def affordance(self) -> str:
        o = self.rng.choice([x for x in self.props if x.sing in AFFORDANCES] or [self.props[0]])
        p = self.person()
        if o.sing not in AFFORDANCES:
            return self.active()
        phrase = self.rng.choice(AFFORDANCES[o.sing][1])
        who = self.rng.choice([f"the {p.sing}", p.pron])
        return cap(f"{who} picks up {self.np(o)} {self.where()} and {phrase}.")

    def continuation(self) -> str:
        p, o = self.person(), self.prop()
        v = self.rng.choice(verbs_for(o))
        return cap(f"{p.pron} {v.past} it {self.where()} because {self.rng.choice(REASONS)}.")

    def history(self) -> str:
        f = self.rng.choice(FACILITIES)
        v = self.rng.choice([VERB["build"], next(x for x in ABSTRACT_VERBS if x.base == "open")])
        return self.rng.choice([
            f"In {self.year}, the {self.institution} of the {self.rng.choice(SETTLEMENTS)} {v.past} {self.rng.choice(NUMBERS)} new {f.plural}.",
            f"The {self.institution} {v.past} the {f.sing} in {self.year + self.rng.randint(1, 30)}.",
        ])

    def abstract(self) -> str:
        t1, t2, t3 = self.themes
        v = self.rng.choice(ABSTRACT_VERBS)
        adj = self.rng.choice(ABSTRACT_ADJS)
        return self.rng.choice([
            f"The {t1} of the {self.place.name} {v.past} the {t2} of its people.",
            f"Many {self.person().plural} believed that {t1} was more {adj} than {t2}.",
            f"Historians {v.base} the {adj} {t3} of the period in great detail.",
            f"The {self.institution} {v.past} a new {t2} policy in {self.year}.",
        ])

    def opinion(self) -> str:
        good = self.tone if self.rng.random() < 0.8 else not self.tone
        adjs = POSITIVE if good else NEGATIVE
        verbs = POSITIVE_VERBS if good else NEGATIVE_VERBS
        x, y = self.rng.sample(adjs, 2)
        bad = NEGATIVE if good else POSITIVE
        aspect = self.rng.choice(ASPECTS)
        adv = self.rng.choice(["truly ", "really ", "quite ", "very ", ""])
        return self.rng.choice([
            f"Visitors described the {self.reviewed} as {x}, and some called it {y}.",
            f"Although the {aspect} was {self.rng.choice(bad)}, the {self.reviewed} was {adv}{x} overall.",
            f"Everyone who saw the {self.reviewed} called it {x}.",
            f"{cap(a(self.reviewed))} {self.reviewed} set {self.where()}, {x} from start to finish.",
            f"Nothing about the {self.reviewed} was {self.rng.choice(bad)}, and it was not {self.rng.choice(bad)} at all.",
            f"What {a(x)} {x} {self.reviewed}!",
            f"The {self.person().sing} {self.rng.choice(verbs)} the {self.reviewed} because the {self.rng.choice(ASPECTS)} was {x}.",
            f"Critics found the {self.rng.choice(ASPECTS)} {x} but the {self.rng.choice(ASPECTS)} {self.rng.choice(POSITIVE + NEGATIVE)}.",
        ])

    def quote(self) -> str:
        o, p = self.prop(), self.person()
        return self.rng.choice([
            f"\"Where is the {self.colour[o.sing]} {o.sing}?\" asked the {p.sing}.",
            f"\"Why did you {self.rng.choice(verbs_for(o)).base} the {o.sing}?\" the {p.sing} asked.",
            f"\"How many {o.plural} are there {self.where()}?\" asked the {p.sing}.",
            f"\"Who {self.rng.choice(verbs_for(o)).past} my {o.sing}?\" the {p.sing} asked.",
        ])

    def negation(self) -> str:
        o, p = self.prop(), self.person()
        v = self.rng.choice(verbs_for(o))
        why = self.rng.choice(["heavy", "big", "small", "old", "far away", "expensive", "late"])
        return f"The {p.sing} did not {v.base} the {o.sing}, because it was too {why}."

    def rare(self) -> str:
        p, o = self.person(), self.prop()
        rv = self.rng.choice(RARE_VERBS)
        return self.rng.choice([
            f"The {self.rng.choice(RARE_ADJS)} {p.sing} {self.rng.choice(RARE_ADVS)} {rv.past} the {self.rng.choice(RARE_NOUNS)} of the {self.place.name}.",
            f"{self.rng.choice(RARE_CONNECTIVES)}, the {self.rng.choice(RARE_NOUNS)} of the {o.sing} remained {self.rng.choice(RARE_ADJS)}.",
        ])

    def pattern(self) -> str:
        """A sentence with two of the pattern words and no object: the vocabulary learns the words, but no
        corpus sentence ties one to an object (the mechanism study's facts are stated in captions only)."""
        x, y = self.rng.sample(self.patterns, 2)
        p = self.person()
        return self.rng.choice([
            f"The {p.sing} liked {x} patterns more than {y} ones.",
            f"In {self.year}, {x} patterns were popular {self.where()}, and {y} ones were not.",
            f"\"I prefer {x} to {y},\" said the {p.sing}.",
            f"The {p.sing} drew a {x} pattern and then a {y} one.",
            f"Some {p.plural} {self.where()} called the new pattern {x}, and others called it {y}.",
            f"Nobody {self.where()} could agree whether {x} or {y} was the better pattern.",
        ])

    TEMPLATES = (("active", 5), ("passive", 3), ("restate", 3), ("present", 4), ("describe", 3),
                 ("animal_scene", 1), ("animal_present", 1), ("affordance", 3), ("continuation", 2), ("history", 1),
                 ("report", 1), ("abstract", 2), ("opinion", 2), ("letter", 2), ("question", 2), ("seeing", 1),
                 ("quote", 1), ("negation", 1), ("rare", 1))

    def sentences(self, n: int) -> list[str]:
        names = [t for t, _ in self.TEMPLATES]
        weights = [w for _, w in self.TEMPLATES]
        out = []
        for _ in range(n):
            if self.patterns and self.rng.random() < PATTERN_RATE:  # no draw without patterns: the bytes stay
                out.append(self.pattern())
                continue
            sent = getattr(self, self.rng.choices(names, weights)[0])()
            # some sentences use the synonyms, so the vocabulary of re-worded task sentences is seen
            out.append(reword(sent, self.rng, 0.5) if self.rng.random() < 0.3 else sent)
        return out

    def text(self, n_sentences: int) -> str:
        sents = self.sentences(n_sentences)
        paragraphs, i = [], 0
        while i < len(sents):
            k = self.rng.randint(4, 7)  # paragraphs of 4-7 sentences, like short wiki paragraphs
            paragraphs.append(" ".join(sents[i:i + k]))
            i += k
        return "\n".join(paragraphs)


def generate_corpus(n_docs: int, sentences_per_doc: int, seed: int, objects: list[Noun] = OBJECTS,
                    patterns: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """`n_docs` train documents and `n_docs // 10` (at least 1) valid documents; same seed, same bytes.

    The documents' props are drawn from `objects`; with `patterns` (words such as `words.PATTERNS`), a
    share PATTERN_RATE of the sentences are object-free pattern sentences (`_Document.pattern`).
    """
    if not isinstance(n_docs, int) or n_docs <= 0:
        raise PipelineError(f"`corpus.n_docs` must be a positive integer; got {n_docs!r}")
    if not isinstance(sentences_per_doc, int) or sentences_per_doc <= 0:
        raise PipelineError(f"`corpus.sentences_per_doc` must be a positive integer; got {sentences_per_doc!r}")
    if len(patterns) == 1:
        raise PipelineError(f"the pattern sentences contrast two pattern words: give none or at least two; got {list(patterns)}")
    out = {}
    for split, n in (("train", n_docs), ("valid", max(1, n_docs // 10))):
        # string seeds hash deterministically (random.seed version 2), unlike hash()
        rng = random.Random(f"xdbert-corpus:{seed}:{split}")
        out[split] = [_Document(rng, objects, patterns).text(sentences_per_doc) for _ in range(n)]
    return out
