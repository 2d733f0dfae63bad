"""The mechanism study's embedded world (issue 55, ../shared/MECHANISM.md "The world"): facts, captions, `vis`.

Each object has one visual attribute (a pattern word of `words.PATTERNS`) that only captions state: the
language corpus never pairs an object with an attribute word (`documents._Document.pattern`). Here:

- `draw_facts`: the real table, its twin (a second balanced table, for the `nofacts` tower), and the
  split of the objects into train, captioned dev and uncaptioned dev objects.
- `captions`: COCO-like scenes plus fact captions about the captioned objects, for either table, from
  one RNG stream, so the twin's captions differ from the real ones in their attribute words alone.
- `vis_examples`: the probe task, single sentences labelled with an attribute.

Every function is pure and deterministic in its seed.
"""
from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass

from xdbert.data.synthetic.events import Row
from xdbert.data.synthetic.words import (
    NUMBERS, PERSONS, PLACES, SIZES, TIMES, Noun, a, cap, generate_captions, verbs_for,
)

SPLITS = ("train", "dev_captioned", "dev_uncaptioned")


@dataclass(frozen=True)
class Facts:
    """The world's facts: object (singular noun) -> attribute in `real` and `twin`, and its split."""

    objects: tuple[Noun, ...]
    attributes: tuple[str, ...]
    real: dict[str, str]
    twin: dict[str, str]
    split: dict[str, str]

    def captioned(self) -> list[Noun]:
        return [o for o in self.objects if self.split[o.sing] != "dev_uncaptioned"]


def _even(counts: Counter, keys) -> bool:
    """Whether `counts` over `keys` are as even as their total allows (they differ by at most one)."""
    values = [counts[k] for k in keys]
    return max(values) - min(values) <= 1


def _step(n: int) -> int:
    """The multiplier of the split's lattice: the integer nearest n / golden ratio that is coprime to n.

    Consecutive objects i get the lattice points (x0 + i * step) mod n, which spread evenly over [0, n)
    along any run of consecutive objects (a Fibonacci lattice), so each stratum's split is near proportional.
    """
    target = n / ((1 + math.sqrt(5)) / 2)
    return min((s for s in range(1, n) if math.gcd(s, n) == 1), key=lambda s: (abs(s - target), s))


def draw_facts(objects: list[Noun], n_old: int, attributes: list[str], seed: int, n_train: int = 40,
               n_dev_captioned: int = 32, n_dev_uncaptioned: int = 8) -> Facts:
    """The real facts, the twin facts and the split, balanced and stratified (raises ValueError if they cannot be).

    The first `n_old` objects are the old ones. A stratum is (old or new, large, buildable): what the corpus
    expresses of an object. The objects are laid out stratum after stratum (shuffled within each) and dealt
    in rounds of k = len(attributes): the i-th object gets attribute i mod k (under a random renaming), so
    each stratum holds every attribute equally often where its size allows and as evenly as it can elsewhere.

    Split: the i-th object's lattice point x = (x0 + i * step) mod N falls in [0, n_train) -> train, the next
    n_dev_captioned points -> dev_captioned, the rest -> dev_uncaptioned. One attribute's objects (every k-th
    one) meet every point of one residue class mod k, so with sizes that are multiples of k each split holds
    every attribute equally often; x0 is the first offset, in a seeded order, that puts half the uncaptioned
    objects among the old ones (evenly over the attributes) and keeps every stratum's split within one object
    of proportional.

    Twin: the real attribute shifted round the attributes by (x // k + c) mod k, c random. Within one
    attribute's objects and one split, x // k runs over consecutive integers, so each split holds every twin
    attribute equally often, each (real, twin) pair occurs on N / k**2 objects, and the twin depends on the
    real table no more than that allows; x0 must also keep the twin as even as the real table in every stratum.
    """
    n, k = len(objects), len(attributes)
    sizes = {"train": n_train, "dev_captioned": n_dev_captioned, "dev_uncaptioned": n_dev_uncaptioned}
    if len({o.sing for o in objects}) != n or len(set(attributes)) != k or k < 2:
        raise ValueError("the objects and the attributes must be distinct, and at least two attributes")
    if sum(sizes.values()) != n or any(v <= 0 or v % k for v in sizes.values()):
        raise ValueError(f"the split sizes {sizes} must be positive multiples of {k} attributes summing to {n} objects")
    if n % (k * k):
        raise ValueError(f"{n} objects cannot hold each of the {k * k} (real, twin) attribute pairs equally often")
    if n_dev_uncaptioned % 2 or not 0 < n_old < n:
        raise ValueError(f"half of {n_dev_uncaptioned} uncaptioned objects must be among {n_old} old ones of {n}")
    rng = random.Random(f"xdbert-facts:{seed}")

    strata: dict[tuple, list[Noun]] = {}
    for i, o in enumerate(objects):
        strata.setdefault((i >= n_old, o.large, o.buildable), []).append(o)
    layout: list[Noun] = []
    bounds = [0]  # where each stratum starts in the layout
    for key in sorted(strata):  # the old strata first: the first n_old places of the layout
        members = strata[key][:]
        rng.shuffle(members)
        layout += members
        bounds.append(len(layout))
    names = rng.sample(attributes, k)  # the renaming: which attribute is "0"

    step = _step(n)
    cuts = [(n_train, "train"), (n_train + n_dev_captioned, "dev_captioned"), (n, "dev_uncaptioned")]
    shift = rng.randrange(k)

    def deal(x0: int) -> tuple[list[str], list[int]]:
        """(split, twin's shift from the real attribute) of each place of the layout, for offset x0."""
        points = [(x0 + i * step) % n for i in range(n)]
        return [next(s for cut, s in cuts if x < cut) for x in points], [(x // k + shift) % k for x in points]

    def acceptable(split: list[str], twin_shift: list[int]) -> bool:
        old_unc = Counter(i % k for i in range(n_old) if split[i] == "dev_uncaptioned")
        if sum(old_unc.values()) != n_dev_uncaptioned // 2 or not _even(old_unc, range(k)):
            return False
        for lo, hi in zip(bounds, bounds[1:]):
            got = Counter(split[lo:hi])
            if any(abs(got[s] - (hi - lo) * sizes[s] / n) > 1 for s in SPLITS):
                return False
            if not _even(Counter((i + twin_shift[i]) % k for i in range(lo, hi)), range(k)):
                return False
        return True

    dealt = next((d for d in map(deal, rng.sample(range(n), n)) if acceptable(*d)), None)
    if dealt is None:
        raise ValueError(f"no split of these {n} objects puts half the uncaptioned ones among the old, keeps every "
                         f"stratum within one object of proportional and the twin even in every stratum")
    split, twin_shift = dealt
    real = {o.sing: names[i % k] for i, o in enumerate(layout)}
    twin = {o.sing: names[(i + twin_shift[i]) % k] for i, o in enumerate(layout)}
    return Facts(objects=tuple(objects), attributes=tuple(attributes), real=real, twin=twin,
                 split={o.sing: split[i] for i, o in enumerate(layout)})


# The fact captions' frames (issue 68): ten with the attribute after the object and ten before it, the attribute
# 1 to 3 tokens from the object. Several frames a side are what makes a fact extractable in a frame never seen
# (Allen-Zhu and Li, Physics of Language Models 3.1: one phrasing is memorized but not extracted; rewrites are).
# No frame shares the two tokens on either side of the object with a `vis` sentence (`_sentence`), the
# representation probe's frames or the M rung's cloze frames (`analysis.cloze`): tests/test_world.py checks
# it, so what those instruments read is never a caption's surface. Slots: {o} the object, {x} its attribute,
# {s} a size word, {p} a person, {w} a place ("in the park"), {a_o} {a_x} {a_p} their articles.
FRAMES_AFTER = (
    "{a_o} {o} {x} and {s} {w}",
    "{a_p} {p} next to {a_o} {o} {x} all over",
    "this {o} {x} like the others {w}",
    "{a_o} {o} painted {x} {w}",
    "{a_o} {o} , {x} and {s} , {w}",
    "{a_o} {o} so {x} it stands out {w}",
    "{a_p} {p} holding up {a_o} {o} all {x}",
    "{a_o} {o} covered in {x} cloth {w}",
    "{a_o} {o} with a {x} pattern {w}",
    "this {o} looks very {x} today",
)
FRAMES_BEFORE = (
    "{a_x} {x} {s} {o} left {w}",
    "{a_p} {p} next to this {x} {o} , smiling",
    "that {x} {o} over there {w}",
    "my {x} {o} again , {w}",
    "{a_x} {x} looking {o} {s} as ever",
    "{x} and {s} {o} , {w}",
    "{a_p} {p} with their {x} {o} nearby",
    "some {x} {s} {o} for sale {w}",
    "only {x} {o} to be seen {w}",
    "{a_x} {x} , {s} {o} standing {w}",
)


def captions(facts: Facts, table: str, n: int, fact_share: float, fact_rate: float, after_object: float,
             seed: int, frames: int = len(FRAMES_AFTER)) -> list[str]:
    """`n` captions: a share `fact_share` are fact captions, the rest COCO-like scenes of all the objects with
    no attribute word (`words.generate_captions`), in a seeded order.

    A fact caption is about one captioned object (train or dev_captioned) and carries its attribute in
    `table` ("real" or "twin") with probability `fact_rate`, else another one. In a share `after_object` of
    them the attribute comes after the object ("a kite striped and old in the park": a causal tower's state at
    the object is trained to predict it), in the rest before it; either way in one of the first `frames`
    frames of that side (`FRAMES_AFTER`, `FRAMES_BEFORE`), drawn evenly. Every draw is made whatever the
    table and the rates, so the twin's captions are the real ones with other attribute words.
    """
    if table not in ("real", "twin"):
        raise ValueError(f"`table` is real or twin; got {table!r}")
    if not 1 <= frames <= len(FRAMES_AFTER):
        raise ValueError(f"`frames` is 1 to {len(FRAMES_AFTER)} frames a side; got {frames!r}")
    facts_of = getattr(facts, table)
    attributes, k = facts.attributes, len(facts.attributes)
    captioned = facts.captioned()
    n_facts = round(n * fact_share)
    rng = random.Random(f"xdbert-fact-captions:{seed}")
    out = generate_captions(n - n_facts, seed, list(facts.objects))
    for _ in range(n_facts):
        obj, own = rng.choice(captioned), rng.random() < fact_rate
        other, after = rng.randrange(1, k), rng.random() < after_object  # drawn even when unused
        attr = attributes[(attributes.index(facts_of[obj.sing]) + (0 if own else other)) % k]
        frame, person, size = rng.randrange(frames), rng.choice(PERSONS), rng.choice(SIZES)
        place = rng.choice(PLACES)
        text = (FRAMES_AFTER if after else FRAMES_BEFORE)[frame].format(
            o=obj.sing, x=attr, s=size, p=person.sing, w=f"{place.prep} the {place.name}",
            a_o=a(obj.sing), a_x=a(attr), a_p=a(person.sing))
        out.append(text + ("." if rng.random() < 0.5 else ""))
    rng.shuffle(out)
    return out


def _sentence(obj: Noun, attr: str | None, rng: random.Random) -> str:
    """One neutral sentence about `obj`, in the corpus's words; it states `attr` of it unless None."""
    np = f"the {attr} {obj.sing}" if attr else f"the {obj.sing}"
    person, place, verb = rng.choice(PERSONS), rng.choice(PLACES), rng.choice(verbs_for(obj))
    where = f"{place.prep} the {place.name}"
    return cap(rng.choice([
        f"the {person.sing} {verb.past} {np} {where}.",
        f"{np} was {verb.pp} by the {person.sing} {where}.",
        f"there is {a(attr or obj.sing)} {attr + ' ' if attr else ''}{obj.sing} {where}.",
        f"everyone saw the {person.sing} with {np}.",
        f"\"Where is {np}?\" asked the {person.sing}.",
        f"one {rng.choice(TIMES)}, the {person.sing} {verb.past} {np}.",
        f"the {person.sing} has {verb.pp} {np} {where}.",
        f"the {person.sing} {verb.past} {rng.choice(NUMBERS)} {attr + ' ' if attr else ''}{obj.plural} {where}.",
    ]))


def _interleaved(objects: list[Noun], facts: Facts, rng: random.Random) -> list[Noun]:
    """`objects` shuffled, then ordered in rounds that take one object of each attribute (real facts), so
    that cycling through them gives every attribute equally often, to within one."""
    by_attr: dict[str, list[Noun]] = {attr: [] for attr in facts.attributes}
    for o in rng.sample(objects, len(objects)):
        by_attr[facts.real[o.sing]].append(o)
    rounds = itertools.zip_longest(*by_attr.values())
    return [o for r in rounds for o in r if o is not None]


def _examples(objects: list[Noun], n_unstated: int, n_stated: int, facts: Facts, rng: random.Random,
              unstated_kind: str) -> list[tuple[str, int, str, str]]:
    """(sentence, label, kind, object): `n_unstated` sentences that state no attribute (label: the object's
    fact), then `n_stated` that state one (label: the stated one), half the fact (T=), half another (T!=)."""
    attributes, k = facts.attributes, len(facts.attributes)
    order = _interleaved(objects, facts, rng)
    out = []
    for j in range(n_unstated):
        o = order[j % len(order)]
        out.append((_sentence(o, None, rng), attributes.index(facts.real[o.sing]), unstated_kind, o.sing))
    n_equal = (n_stated + 1) // 2
    for j in range(n_stated):
        o = order[j % len(order)]
        fact = attributes.index(facts.real[o.sing])
        # T!=: the shift to another attribute cycles round by round of the order (one object of each attribute),
        # so every (fact, stated) pair occurs, and the stated attributes stay as even as the facts
        stated = fact if j < n_equal else (fact + 1 + ((j - n_equal) // k) % (k - 1)) % k
        out.append((_sentence(o, attributes[stated], rng), stated, "T=" if stated == fact else "T!=", o.sing))
    return out


def vis_examples(facts: Facts, n_train: int = 800, n_f_plus: int = 256, n_f_zero: int = 64, n_t: int = 80,
                 seed: int = 0) -> tuple[dict[str, list[Row]], list[dict[str, str]]]:
    """The probe task `vis`: ({"train": rows, "dev": rows}, the dev rows' {"kind", "object"}), 4-way.

    Single sentences (`Row`s with no second text); the label is the index in `facts.attributes` of the
    object's real attribute when the sentence states none, of the stated attribute when it states one.
    Dev: F+ (`n_f_plus`, unstated, captioned dev objects), F0 (`n_f_zero`, unstated, uncaptioned ones) and
    T (`n_t`, stated, on every dev object: T= states the fact, T!= another attribute, half each). Train:
    `n_train` sentences on the train objects, with the same share of stated sentences as dev. Each kind's
    labels are as even as its size allows; the rows come in a seeded order.
    """
    if min(n_train, n_f_plus, n_f_zero, n_t) <= 0:
        raise ValueError("every count of the vis task must be positive")
    rng = random.Random(f"xdbert-vis:{seed}")
    of = {s: [o for o in facts.objects if facts.split[o.sing] == s] for s in SPLITS}
    n_stated = round(n_train * n_t / (n_f_plus + n_f_zero + n_t))
    train = _examples(of["train"], n_train - n_stated, n_stated, facts, rng, "train")
    dev = (_examples(of["dev_captioned"], n_f_plus, 0, facts, rng, "F+")
           + _examples(of["dev_uncaptioned"], n_f_zero, 0, facts, rng, "F0")
           + _examples(of["dev_captioned"] + of["dev_uncaptioned"], 0, n_t, facts, rng, "T"))
    rng.shuffle(train)
    rng.shuffle(dev)
    rows = {"train": [(text, None, None, label) for text, label, _, _ in train],
            "dev": [(text, None, None, label) for text, label, _, _ in dev]}
    return rows, [{"kind": kind, "object": obj} for _, _, kind, obj in dev]
