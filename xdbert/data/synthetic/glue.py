"""Generated stand-ins for the eight GLUE tasks (embedded profile): same schema, label space and metric.

Every example is built from events (`xdbert.data.synthetic.events`) and rendered by templates, so each
label is TRUE of its text:

- mrpc: a paraphrase re-words the same content (active <-> passive, fronted adjuncts, exact
  synonyms); a non-paraphrase changes one or two content slots, adds a fact the other sentence lacks,
  or negates the event (MRPC's guideline: more information or a contradiction is not equivalent).
- qqp: duplicates ask the same question (same intent and slots, another template); non-duplicates
  ask another kind of question, about another thing, or a narrower one ("... for my sister?").
- rte / mnli: an entailed hypothesis is a sub-fact of the premise; a contradiction changes a colour,
  number, year or place of the same event, or negates it; a neutral hypothesis adds facts the premise
  does not settle (RTE counts it as not entailed). MNLI train and dev_matched mix two genres (fiction,
  government reports); dev_mismatched is a third genre (first-person letters), so they differ as in MNLI.
- stsb: 5..2 = two statements of events sharing 5..2 of their five content slots; 1 = a scene sharing
  one detail; 0 = another topic; plus a little annotator noise.
- cola: negatives are ungrammatical by construction: agreement violations, wrong verb forms, a
  missing verb, or three neighbouring words out of order.
- sst2: sentiment words decide, including negated ones ("not boring") and contrast clauses.
- qnli: the sentence answers the question only if it is about the same event and has the asked slot.

Besides the mechanisms that need the two texts compared word by word, several kinds of example carry
evidence inside one text, as the real datasets do (negation in contradictions, added clauses in
non-paraphrases, off-topic sentences at low similarity): a 2-layer model trained from scratch on 500
examples picks these up well before it learns to match words across sentences.

Each generator is `gen_<task>(rng, label, objects=OBJECTS) -> Row`; `xdbert.data.synthetic.tasks` balances the labels.
"""
from __future__ import annotations

import random

from xdbert.data.synthetic.events import (
    SLOTS, STYLES, Event, Row, change, contradiction, event_verbs, extra_info, negated_subfacts, neutral,
    number_word, other_year, random_event, say, subfacts, two_styles,
)
from xdbert.data.synthetic.words import (
    ABSTRACT_NOUNS, ABSTRACT_VERB, ANIMALS, ASPECTS, COLOURS, FACILITIES, INSTITUTIONS, INTRANSITIVE, NEGATIVE,
    NEGATIVE_VERBS, OBJECTS, PLACES, POSITIVE, POSITIVE_VERBS, REASONS, RELATIVES, REVIEWED, SETTLEMENTS, TIMES,
    VERB, Noun, a, cap, reword, verbs_for,
)

# what institutions do to facilities (MNLI government genre)
_GOV_VERBS = [VERB["build"]] + [ABSTRACT_VERB[b] for b in ("open", "close", "improve", "approve")]


def gen_mrpc(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """1 = equivalent: the same event (negated or with the same added fact in both) in another voice
    and order and with synonyms. 0 = not equivalent: one or two slots differ, the second sentence adds
    a fact the first lacks, or it negates the event."""
    ev = random_event(rng, objects, year_p=0.3, count_p=0.3)
    s1, s2 = two_styles(rng)
    if label == 1:
        r = rng.random()
        neg, extra = r < 0.15, extra_info(ev, rng) if 0.15 <= r < 0.3 else ""
        a_text, b_text = say(ev, s1, neg, extra), say(ev, s2, neg, extra)
    else:
        r = rng.random()
        a_text = say(ev, s1)
        if r < 0.5:
            other = ev
            for slot in rng.sample(SLOTS + (("count",) if ev.count > 1 else ()), rng.choice([1, 1, 2])):
                other = change(other, slot, rng, objects)
            b_text = say(other, s2)
        elif r < 0.75:
            b_text = say(ev, s2, extra=extra_info(ev, rng))
        else:
            b_text = say(ev, s2, negated=True)
    return reword(a_text, rng, 0.3), reword(b_text, rng, 0.6), None, label


def gen_rte(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """0 = entailment (a sub-fact of the two-sentence premise); 1 = not entailed (a changed slot, a
    wrongly bound attribute, or a negation)."""
    ev = random_event(rng, objects, year_p=0.4, count_p=0.3)
    obj2 = rng.choice([o for o in objects if o != ev.obj])
    ev2 = Event(ev.subj, rng.choice([v for v in event_verbs(obj2) if v != ev.verb]),
                rng.choice([c for c in COLOURS if c != ev.colour]), obj2, rng.choice([p for p in PLACES if p != ev.place]))
    premise = f"{say(ev, rng.choice(STYLES))} Later, {ev.subj.pron} {ev2.verb.past} {ev2.np()} {ev2.where}."
    target = ev if rng.random() < 0.7 else ev2
    entailed = set(subfacts(ev)) | set(subfacts(ev2))
    if label == 0:
        hyp = rng.choice(subfacts(target))
    else:
        hyp = next(h for h in iter(lambda: _rte_negative(ev, ev2, target, rng, objects), None) if h not in entailed)
    return reword(premise, rng, 0.3), reword(hyp, rng, 0.3), None, label


def _rte_negative(ev: Event, ev2: Event, target: Event, rng: random.Random, objects: list[Noun]) -> str:
    """A hypothesis the premise does not entail: a changed slot, a wrongly bound colour, a negation."""
    kind = rng.choices(["slot", "bind", "negation", "neutral"], [0.35, 0.15, 0.25, 0.25])[0]
    if kind == "negation":
        return rng.choice(negated_subfacts(target))
    if kind == "neutral":  # adds a fact the premise does not settle
        return neutral(target, rng)
    if kind == "bind":  # the other object's colour on this object
        return f"The {ev.obj.plural if ev.count > 1 else ev.obj.sing} {ev.be} {ev2.colour}."
    slot = rng.choice(["subj", "verb", "colour", "obj", "place"] + (["year"] if target.year else []))
    changed = change(target, slot, rng, objects)
    return rng.choice([h for h, o in zip(subfacts(changed), subfacts(target)) if h != o])


def gen_stsb(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """Score = how much two sentences share (+ small annotator noise), on STS-B's 0-5 scale.

    5..2: two statements of events sharing 5..2 of their five content slots (subject, verb, colour,
    object, place); 1: a scene that shares one detail (the place or the colour) but is about an animal;
    0: a sentence on another topic altogether (a review, a council report, an opinion).
    """
    ev = random_event(rng, objects, count_p=0.2)
    s1, s2 = two_styles(rng)
    if label >= 2:
        other = ev
        for slot in rng.sample(SLOTS, 5 - label):
            other = change(other, slot, rng, objects)
        b_text = say(other, s2)
    elif label == 1:
        animal, v = rng.choice(ANIMALS), rng.choice(INTRANSITIVE)
        if rng.random() < 0.5:
            b_text = f"A {rng.choice([c for c in COLOURS if c != ev.colour])} {animal.sing} {v.past} {ev.where}."
        else:
            other = change(ev, "place", rng)
            b_text = f"A {ev.colour} {animal.sing} {v.past} {other.where}."
    else:
        fac, thing = rng.choice(FACILITIES), rng.choice(REVIEWED)
        b_text = rng.choice([
            f"The {thing} was {rng.choice(POSITIVE + NEGATIVE)}.",
            f"In {rng.randint(1850, 2015)}, the {rng.choice(INSTITUTIONS)} built {number_word(rng.randint(2, 9))} new {fac.plural}.",
            f"Many people believed that {rng.choice(ABSTRACT_NOUNS)} was more important than {rng.choice(ABSTRACT_NOUNS)}.",
        ])
    score = min(5.0, max(0.0, label + rng.gauss(0.0, 0.15)))
    return reword(say(ev, s1), rng, 0.3), reword(b_text, rng, 0.5), None, round(score, 2)


def _cola_sentence(rng: random.Random, objects: list[Noun]) -> tuple[list[str], dict]:
    """A grammatical sentence as words, with where its verb is and how it could be broken."""
    kind = rng.choice(["past", "passive", "present", "intransitive", "perfect", "progressive", "there"])
    ev = random_event(rng, objects, count_p=0.3)
    plural = rng.random() < 0.5
    subj = ev.subj.plural if plural else ev.subj.sing
    the = "The" if rng.random() < 0.7 else ("Some" if plural else "A")
    info: dict = {"plural": plural}
    if kind == "past":
        words = [the, subj, ev.verb.past] + ev.np().split() + ev.where.split()
        info.update(verb=[2], agree=None, form=None)
    elif kind == "passive":
        words = ev.np().split() + [ev.be, ev.verb.pp, "by", "the", ev.subj.sing] + ev.where.split()
        words[0] = cap(words[0])
        i = len(ev.np().split())
        info.update(verb=[i, i + 1], agree=(i, "were" if ev.be == "was" else "was"),
                    form=(i + 1, ev.verb.base) if ev.verb.base != ev.verb.pp else None)
    elif kind == "present":
        words = [the, subj, ev.verb.base if plural else ev.verb.s] + ev.np().split() + ev.where.split()
        info.update(verb=[2], agree=(2, ev.verb.s if plural else ev.verb.base), form=(2, ev.verb.ing))
    elif kind == "intransitive":
        animal, v = rng.choice(ANIMALS), rng.choice(INTRANSITIVE)
        if animal.sing == animal.plural:  # "sheep runs" vs "sheep run" would both be fine
            animal = ANIMALS[0]
        words = [the, animal.plural if plural else animal.sing, v.base if plural else v.s] + ev.where.split()
        info.update(verb=[2], agree=(2, v.s if plural else v.base), form=(2, v.ing))
    elif kind == "perfect":
        aux = "have" if plural else "has"
        words = [the, subj, aux, ev.verb.pp] + ev.np().split() + ev.where.split()
        info.update(verb=[2, 3], agree=(2, "has" if plural else "have"),
                    form=(3, ev.verb.ing) if ev.verb.past == ev.verb.pp else (3, ev.verb.past))
    elif kind == "progressive":
        aux = "are" if plural else "is"
        words = [the, subj, aux, ev.verb.ing] + ev.np().split() + ev.where.split()
        info.update(verb=[2, 3], agree=(2, "is" if plural else "are"), form=(3, ev.verb.past))
    else:  # there is / there are
        n = rng.randint(2, 9)
        words = (["There", "are", number_word(n), ev.colour, ev.obj.plural] if plural
                 else ["There", "is", a(ev.colour), ev.colour, ev.obj.sing]) + ev.where.split()
        info.update(verb=[1], agree=(1, "is" if plural else "are"), form=(1, "be"))
    return words, info


def gen_cola(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """1 = acceptable; 0 = the same kind of sentence broken: agreement, verb form, missing verb, word order."""
    words, info = _cola_sentence(rng, objects)
    if label == 0:
        options = ["order", "missing_verb"] + (["agree", "agree"] if info.get("agree") else []) + (["form"] if info.get("form") else [])
        kind = rng.choice(options)
        if kind in ("agree", "form"):
            i, w = info[kind]
            words[i] = w
        elif kind == "missing_verb":
            words = [w for j, w in enumerate(words) if j not in info["verb"]]
        else:
            # scramble three neighbouring words; with one adjective per phrase no order but the
            # original is English ("the red car" -> "red car the", "in the park" -> "the in park")
            words = [words[0].lower()] + words[1:]
            original = list(words)
            while words == original:
                i = rng.randrange(len(words) - 2)
                span = words[i:i + 3]
                rng.shuffle(span)
                words = original[:i] + span + original[i + 3:]
            words[0] = cap(words[0])
    return " ".join(words) + ".", None, None, label


# which aspects each reviewed thing has ("the acting of the film", never "the food of the film")
_ASPECTS_OF = {
    **{t: ["acting", "plot", "ending", "music", "dialogue", "lighting", "pace"] for t in ("film", "play", "show")},
    **{t: ["plot", "ending", "dialogue", "pace"] for t in ("book", "novel", "story")},
    **{t: ["music", "ending", "pace", "lighting"] for t in ("song", "album", "concert")},
    "meal": ["food", "service", "pace"], "hotel": ["service", "food", "design"], "exhibition": ["design", "lighting", "pace"],
}
assert set(_ASPECTS_OF) == set(REVIEWED) and {x for v in _ASPECTS_OF.values() for x in v} <= set(ASPECTS)


def gen_sst2(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """1 = positive, 0 = negative: sentiment words decide, including negated opposites and contrasts."""
    good, bad = (POSITIVE, NEGATIVE) if label == 1 else (NEGATIVE, POSITIVE)
    x, y = rng.sample(good, 2)
    thing = rng.choice(REVIEWED)
    aspect, aspect2 = rng.sample(_ASPECTS_OF[thing], 2)
    adv = rng.choice(["", "", "truly ", "really ", "quite ", "very "])
    ev = random_event(rng, objects)
    r = rng.random()
    if r < 0.2:  # negation of the opposite word carries the label
        text = rng.choice([f"The {thing} was not {rng.choice(bad)} at all.", f"The {aspect} of the {thing} was far from {rng.choice(bad)}.",
                           f"Nothing about the {thing} was {rng.choice(bad)}."])
    elif r < 0.35:  # the main clause decides, the concession says the opposite
        text = f"Although the {aspect} was {rng.choice(bad)}, the {thing} was {adv}{x} overall."
    else:
        verbs = POSITIVE_VERBS if label == 1 else NEGATIVE_VERBS
        text = rng.choice([
            f"The {thing} was {adv}{x}.",
            f"I thought the {thing} was {x} and {y}.",
            f"What {a(x)} {x} {thing}!",
            f"The {aspect} of the {thing} was {x}, and the {aspect2} was {adv}{y}.",
            f"Everyone who saw the {thing} about the {ev.colour} {ev.obj.sing} called it {x}.",
            f"The {ev.subj.sing} {rng.choice(verbs)} the {thing}; it was {adv}{x}.",
            f"{cap(a(thing))} {thing} set {ev.where}, {x} from start to finish.",
        ])
    return reword(text, rng, 0.3), None, None, label


# question type -> the event slot it asks for
_QNLI_SLOTS = {"where": "place", "colour": "colour", "who": "subj", "when": "year", "howmany": "count"}


def _qnli_question(ev: Event, qtype: str) -> str:
    if qtype == "where":
        return f"Where did the {ev.subj.sing} {ev.verb.base} the {ev.colour} {ev.obj.plural if ev.count > 1 else ev.obj.sing}?"
    if qtype == "colour":
        return f"What colour {'were' if ev.count > 1 else 'was'} the {ev.obj.plural if ev.count > 1 else ev.obj.sing} that the {ev.subj.sing} {ev.verb.past}?"
    if qtype == "who":
        return f"Who {ev.verb.past} the {ev.colour} {ev.obj.plural if ev.count > 1 else ev.obj.sing}?"
    if qtype == "when":
        return f"In what year did the {ev.subj.sing} {ev.verb.base} the {ev.obj.plural if ev.count > 1 else ev.obj.sing}?"
    return f"How many {ev.obj.plural} did the {ev.subj.sing} {ev.verb.base}?"


def _qnli_sentence(ev: Event, show: set[str], rng: random.Random) -> str:
    """`ev` stated with only the optional slots in `show` (place, colour, year, count, subj)."""
    np = (f"{number_word(ev.count)} " if "count" in show else "the ") + (f"{ev.colour} " if "colour" in show else "") + \
        (ev.obj.plural if ev.count > 1 else ev.obj.sing)
    where = f" {ev.where}" if "place" in show else ""
    when = f" in {ev.year}" if "year" in show else ""
    be = ev.be
    if "subj" in show and rng.random() < 0.6:
        return cap(f"the {ev.subj.sing} {ev.verb.past} {np}{where}{when}.")
    if "subj" in show:
        return cap(f"{np} {be} {ev.verb.pp} by the {ev.subj.sing}{where}{when}.")
    return cap(f"{np} {be} {ev.verb.pp}{where}{when}.")


def gen_qnli(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """0 = the sentence answers the question (same event, asked slot present); 1 = it does not: the
    asked slot is missing, the sentence is about a nearly identical event, or (as most of QNLI's
    negatives, other sentences of the same Wikipedia paragraph) about an unrelated event."""
    qtype = rng.choice(list(_QNLI_SLOTS))
    slot = _QNLI_SLOTS[qtype]
    ev = random_event(rng, objects, year_p=1.0, count_p=1.0 if qtype == "howmany" else 0.3)
    question = _qnli_question(ev, qtype)
    optional = [s for s in ("place", "colour", "year", "count") if s != slot and (s != "count" or ev.count > 1)]
    # the subject identifies the event, so it is always said, except where it is the asked slot
    show = {s for s in optional if rng.random() < 0.5} | ({"subj"} if slot != "subj" else set())
    told = ev
    r = rng.random()
    if label == 0 or r >= 0.4:
        show.add(slot)
        if label == 1 and r < 0.6:  # another event: same kind of answer, wrong thing
            told = change(ev, rng.choice(["verb", "obj"]), rng, objects)
        elif label == 1:  # an unrelated event of the same paragraph: other subject, action and thing
            told = random_event(rng, objects, year_p=1.0, count_p=1.0 if qtype == "howmany" else 0.3)
            while told.subj == ev.subj or told.obj == ev.obj or told.verb == ev.verb:
                told = random_event(rng, objects, year_p=1.0, count_p=1.0 if qtype == "howmany" else 0.3)
    # without "subj" in `show` the sentence is an agentless passive: "who" has no answer
    return reword(question, rng, 0.3), reword(_qnli_sentence(told, show, rng), rng, 0.3), None, label


# QQP: a question is an intent with slots; templates of the same intent are paraphrases.
_QQP = {
    "howto": ["How do I {verb} {a_obj}?", "What is the best way to {verb} {a_obj}?", "How can I {verb} my {obj}?",
              "What is the easiest way to {verb} {a_obj}?"],
    "buy": ["Where can I buy {a_col} {colour} {obj}?", "Where is the best place to purchase {a_col} {colour} {obj}?",
            "Which shop sells {colour} {objs}?", "Where do people buy {colour} {objs}?"],
    "why": ["Why are so many {objs} {colour}?", "What is the reason that most {objs} are {colour}?",
            "Why do {objs} usually come in {colour}?"],
    "bring": ["Should I bring {a_obj} to the {place}?", "Is it a good idea to take {a_obj} to the {place}?",
              "Do I need {a_obj} {where}?"],
    "reuse": ["What can I do with an old {obj}?", "How can I reuse an old {obj}?", "What are good uses for an old {obj}?"],
}


# what narrows each kind of question (a narrower question is not a duplicate of the general one)
_QQP_NARROWER = {
    "howto": [" for my {rel}", " in one day", " without any help"],
    "buy": [" for my {rel}", " in the {time}"],
    "why": [" in the {time}"],
    "bring": [" in the {time}", " for my {rel}"],
    "reuse": [" for my {rel}", " in the {time}"],
}
_HOWTO_VERBS = {"paint", "wash", "fix", "build", "pack", "wrap", "sell", "hide", "move", "carry", "draw"}


def _qqp_slots(rng: random.Random, objects: list[Noun]) -> dict:
    obj, colour, place = rng.choice(objects), rng.choice(COLOURS), rng.choice(PLACES)
    return {"obj": obj.sing, "objs": obj.plural, "a_obj": f"{a(obj.sing)} {obj.sing}", "colour": colour, "a_col": a(colour),
            "verb": rng.choice([v for v in event_verbs(obj) if v.base in _HOWTO_VERBS]).base,
            "place": place.name, "where": f"{place.prep} the {place.name}", "_obj": obj}


def gen_qqp(rng: random.Random, label: int, objects: list[Noun] = OBJECTS) -> Row:
    """1 = duplicate (same intent and slots, another wording); 0 = one slot differs or another intent."""
    intent = rng.choice(list(_QQP))
    slots = _qqp_slots(rng, objects)
    t1, t2 = rng.sample(_QQP[intent], 2)
    intent2, slots2 = intent, dict(slots)
    constraint = rng.choice(_QQP_NARROWER[intent]).format(rel=rng.choice(RELATIVES), time=rng.choice(TIMES))
    r = rng.random()
    if label == 1 and r < 0.15:  # both ask the narrower question
        t1, t2 = t1[:-1] + constraint + "?", t2[:-1] + constraint + "?"
    if label == 0:
        if r < 0.35:  # another intent; half of the time about another thing too, as most of QQP's non-duplicates
            intent2 = rng.choice([i for i in _QQP if i != intent])
            t2 = rng.choice(_QQP[intent2])
            if r < 0.175:
                slots2 = _qqp_slots(rng, objects)
        elif r < 0.65:  # the second question asks for more: a different question on Quora
            t2 = t2[:-1] + constraint + "?"
        else:
            fresh = _qqp_slots(rng, objects)
            used = [k for k in ("verb", "colour", "place") if "{" + k + "}" in t1 + t2] + ["obj"]
            used = ["where" if k == "place" else k for k in used]
            key = rng.choice(used)
            while fresh[key] == slots[key]:
                fresh = _qqp_slots(rng, objects)
            if key == "obj":
                # keep the verb valid for the new object
                slots2.update({k: fresh[k] for k in ("obj", "objs", "a_obj", "_obj")})
                if VERB[slots["verb"]] not in verbs_for(fresh["_obj"]):
                    slots2["verb"] = fresh["verb"]
            else:
                slots2[key] = fresh[key]
                if key == "colour":
                    slots2["a_col"] = fresh["a_col"]
                if key == "where":
                    slots2["place"] = fresh["place"]
    return reword(t1.format(**slots), rng, 0.3), reword(t2.format(**slots2), rng, 0.5), None, label


def _mnli_fiction(rng: random.Random, label: int, objects: list[Noun]) -> tuple[str, str]:
    ev = random_event(rng, objects, year_p=0.3, count_p=0.4)
    premise = say(ev, rng.choice(STYLES))
    if label == 0:
        return premise, rng.choice(subfacts(ev))
    if label == 1:
        return premise, neutral(ev, rng)
    return premise, contradiction(ev, rng)


def _mnli_government(rng: random.Random, label: int) -> tuple[str, str]:
    inst, town, fac = rng.choice(INSTITUTIONS), rng.choice(SETTLEMENTS), rng.choice(FACILITIES)
    verb = rng.choice(_GOV_VERBS)
    n, yr = rng.randint(2, 9), rng.randint(1850, 2015)
    theme = rng.choice(ABSTRACT_NOUNS)
    new = "old" if verb.base in ("close", "improve") else "new"
    premise = rng.choice([
        f"In {yr}, the {inst} of the {town} {verb.past} {number_word(n)} {new} {fac.plural} after a long debate about {theme}.",
        f"After a long debate about {theme}, the {inst} of the {town} {verb.past} {number_word(n)} {new} {fac.plural} in {yr}.",
    ])
    if label == 0:
        hyp = rng.choice([f"The {inst} {verb.past} {new} {fac.plural}.", f"{cap(number_word(n))} {fac.plural} were {verb.pp} in the {town}.",
                          f"The {inst} {verb.past} {fac.plural} in {yr}.", f"There was a debate about {theme} in the {town}."])
    elif label == 1:
        hyp = rng.choice([f"The {fac.plural} were paid for by the {rng.choice([i for i in INSTITUTIONS if i != inst])}.",
                          f"The {inst} {verb.past} the {fac.plural} because {rng.choice(REASONS)}.",
                          f"Most people in the {town} supported the decision.",
                          f"The {fac.plural} cost more than the {inst} had planned."])
    else:
        m = rng.choice([k for k in range(2, 10) if k != n])
        hyp = rng.choice([f"The {inst} {verb.past} {number_word(m)} {new} {fac.plural}.", f"The {inst} did not {verb.base} any {fac.plural}.",
                          f"The {inst} {verb.past} the {fac.plural} in {other_year(yr, rng)}.",
                          f"There was no debate about {theme} in the {town}."])
    return premise, hyp


_LETTER_TIMES = ["night", "weekend", "summer", "winter", "spring", "autumn"]


def _mnli_letters(rng: random.Random, label: int, objects: list[Noun]) -> tuple[str, str]:
    """First-person accounts: a genre the training data never shows (dev_mismatched only)."""
    ev = random_event(rng, objects, count_p=0.4)
    rel = rng.choice(RELATIVES)
    the_obj = f"the {ev.obj.plural}" if ev.count > 1 else f"the {ev.obj.sing}"
    premise = rng.choice([
        f"Last {rng.choice(_LETTER_TIMES)} I {ev.verb.past} {ev.np()} {ev.where}, and my {rel} helped me.",
        f"My {rel} and I {ev.verb.past} {ev.np()} {ev.where} last {rng.choice(_LETTER_TIMES)}.",
    ])
    if label == 0:
        hyp = rng.choice([f"I {ev.verb.past} {the_obj}.", f"{cap(the_obj)} {ev.be} {ev.colour}.", f"My {rel} was {ev.where}.",
                          f"Someone helped me {ev.verb.base} {the_obj}."])
    elif label == 1:
        hyp = rng.choice([f"I {ev.verb.past} {the_obj} for my {rng.choice([r for r in RELATIVES if r != rel])}'s birthday.",
                          f"{cap(the_obj)} {ev.be} expensive.", f"My {rel} lives {ev.where}.",
                          f"I {ev.verb.past} {the_obj} because {rng.choice(REASONS)}."])
    else:
        other = change(ev, "colour", rng)
        hyp = rng.choice([f"I did not {ev.verb.base} {the_obj}.", f"{cap(the_obj)} {ev.be} {other.colour}.",
                          f"I {ev.verb.past} {the_obj} {change(ev, 'place', rng).where}.", "Nobody helped me."]
                         + ([f"I {ev.verb.past} {number_word(change(ev, 'count', rng).count)} {ev.obj.plural}."] if ev.count > 1 else []))
    return premise, hyp


def gen_mnli(rng: random.Random, label: int, genre: str = "matched", objects: list[Noun] = OBJECTS) -> Row:
    """0 entailment, 1 neutral, 2 contradiction. `matched`: fiction or government; `mismatched`: letters."""
    if genre == "mismatched":
        p, h = _mnli_letters(rng, label, objects)
    elif rng.random() < 0.5:
        p, h = _mnli_fiction(rng, label, objects)
    else:
        p, h = _mnli_government(rng, label)
    return reword(p, rng, 0.3), reword(h, rng, 0.3), None, label
