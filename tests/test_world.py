"""The mechanism study's world (issue 55): the 80 objects, the pattern sentences, the facts, captions and `vis`."""
import hashlib
import json
import random
import re
from collections import Counter

import pytest

from xdbert.data.synthetic import world
from xdbert.data.synthetic.documents import _Document, generate_corpus
from xdbert.data.synthetic.tasks import GENERATORS, generate_task
from xdbert.data.synthetic.words import AFFORDANCES, EXTRA_OBJECTS, OBJECTS, PATTERNS, generate_captions
from xdbert.errors import PipelineError

ALL = OBJECTS + EXTRA_OBJECTS
NOUNS = {w for o in ALL for w in (o.sing, o.plural)}
NEW_NOUNS = {w for o in EXTRA_OBJECTS for w in (o.sing, o.plural)}
OLD = {o.sing for o in OBJECTS}
SIZES = {"train": 40, "dev_captioned": 32, "dev_uncaptioned": 8}


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()


def strata() -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for o in ALL:
        out.setdefault((o.sing in OLD, o.large, o.buildable), []).append(o.sing)
    return out


# ---------------------------------------------------------------------------------------------
# The objects and the attribute words
# ---------------------------------------------------------------------------------------------

def test_objects_and_attributes_are_single_tokens_for_clip_and_bert():
    from xdbert import mirror
    from xdbert.clip import clip_tokenizer

    clip = clip_tokenizer("xdbert-tiny")
    bert = set(mirror.bert_vocab().read_text(encoding="utf-8").split("\n"))
    everything = [o.sing for o in ALL] + PATTERNS
    assert len(ALL) == 80 and len(set(everything)) == 84
    assert [w for w in everything if len(clip.encode(w)) != 1] == []
    assert [w for w in everything if w not in bert] == []
    assert len(clip.encode("zigzag")) > 1  # the check can fail


def test_objects_and_attributes_are_single_tokens_in_the_trained_vocabulary():
    from xdbert.data.tokenization.vocab import train_wordpiece

    corpus = generate_corpus(200, 30, 0, ALL, tuple(PATTERNS))
    tok = train_wordpiece(corpus["train"], 4000, 128)
    assert [w for w in [o.sing for o in ALL] + PATTERNS if len(tok.tokenize(w)) != 1] == []


def test_strata_sizes():
    """(old, large, buildable) -> size; the new strata are multiples of 4, so their facts are exactly even."""
    assert {k: len(v) for k, v in strata().items()} == {
        (True, False, False): 31, (True, False, True): 5, (True, True, False): 2, (True, True, True): 6,
        (False, False, False): 24, (False, False, True): 4, (False, True, False): 4, (False, True, True): 4}


def test_new_nouns_are_no_other_word_of_the_default_data():
    """The new nouns enter the data only as objects: today's corpus, tasks and captions never use them."""
    text = " ".join(generate_corpus(60, 30, 0)["train"] + generate_captions(2000, 0))
    for task in GENERATORS:
        for table in generate_task(task, 100, 10, 0).values():
            text += " ".join(str(v) for row in table.to_pylist() for v in row.values())
    assert words(text) & (NEW_NOUNS | set(PATTERNS)) == set()
    assert words(text) & OLD == OLD  # the check can fail


# ---------------------------------------------------------------------------------------------
# The generators' objects argument and the pattern sentences
# ---------------------------------------------------------------------------------------------

# computed on the code before `objects` and `patterns` existed (commit a2a164f)
BEFORE = {"corpus": "3b954380caf1a6b8011b4dcaa67b7c9538588829a989771cbf25807a2839119f",
          "tasks": "4f053ddf0362166d0cb320d5b8629177a4030e74ad5324a9225a94aa8928b77e",
          "captions": "685a7a4e7f610c512fdc8147d8560749c1f3baccae872a75a1068a496f894826"}


def tasks_hash(**kw) -> str:
    return sha({t: {s: tab.to_pylist() for s, tab in generate_task(t, 40, 12, 7, **kw).items()} for t in GENERATORS})


def test_defaults_give_the_same_bytes_as_before():
    assert sha(generate_corpus(4, 30, 7)) == BEFORE["corpus"]
    assert sha(generate_corpus(4, 30, 7, OBJECTS, ())) == BEFORE["corpus"]
    assert tasks_hash() == tasks_hash(objects=OBJECTS) == BEFORE["tasks"]
    assert sha(generate_captions(300, 7)) == sha(generate_captions(300, 7, OBJECTS)) == BEFORE["captions"]


def test_new_objects_enter_every_generator():
    corpus = " ".join(generate_corpus(200, 30, 0, ALL)["train"])
    assert words(corpus) >= {o.sing for o in ALL}
    assert words(" ".join(generate_captions(3000, 0, ALL))) >= {o.sing for o in ALL}
    for task in GENERATORS:
        text = " ".join(str(v) for tab in generate_task(task, 200, 20, 0, objects=ALL).values()
                        for row in tab.to_pylist() for v in row.values())
        assert words(text) & NEW_NOUNS, task
    swag = generate_task("swag", 400, 20, 0, objects=ALL)["train"].to_pylist()
    new_with_affordances = {o.sing for o in EXTRA_OBJECTS if o.sing in AFFORDANCES}
    assert {w for row in swag for w in words(row["text_a"])} >= new_with_affordances


def test_pattern_sentences_never_pair_an_object_with_an_attribute():
    rng = random.Random(0)
    said = [s for _ in range(200) for s in _Document(rng, ALL, tuple(PATTERNS)).sentences(30)]
    with_attr = [s for s in said if words(s) & set(PATTERNS)]
    assert [s for s in with_attr if words(s) & NOUNS] == []
    assert words(" ".join(with_attr)) >= set(PATTERNS)
    assert 0.01 < len(with_attr) / len(said) < 0.03  # documents.PATTERN_RATE
    assert [s for s in said if words(s) & NOUNS]  # the check can fail
    # the corpus is made of these sentences; without pattern words it has no attribute word at all
    corpus = generate_corpus(200, 30, 0, ALL, tuple(PATTERNS))
    assert words(" ".join(corpus["train"])) & set(PATTERNS) == set(PATTERNS)
    assert not words(" ".join(generate_corpus(200, 30, 0, ALL)["train"])) & set(PATTERNS)
    with pytest.raises(PipelineError, match="two pattern words"):
        generate_corpus(2, 5, 0, ALL, ("striped",))


# ---------------------------------------------------------------------------------------------
# Facts and splits
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[0, 1, 100])
def facts(request):
    return world.draw_facts(ALL, len(OBJECTS), PATTERNS, request.param)


def even(counts: Counter, keys=PATTERNS) -> bool:
    values = [counts[k] for k in keys]
    return max(values) - min(values) <= 1


def test_facts_are_balanced_within_every_stratum(facts):
    for table in (facts.real, facts.twin):
        assert Counter(table.values()) == {a: 20 for a in PATTERNS}
        for key, members in strata().items():
            got = Counter(table[m] for m in members)
            assert even(got), (key, got)
            if len(members) % 4 == 0:
                assert set(got.values()) == {len(members) // 4}


def test_each_split_is_balanced_over_the_attributes(facts):
    per = {"train": 10, "dev_captioned": 8, "dev_uncaptioned": 2}
    for split, n in per.items():
        members = [o for o, s in facts.split.items() if s == split]
        assert Counter(facts.real[o] for o in members) == {a: n for a in PATTERNS}
        assert Counter(facts.twin[o] for o in members) == {a: n for a in PATTERNS}


def test_uncaptioned_objects_are_half_old_half_new(facts):
    unc = [o for o, s in facts.split.items() if s == "dev_uncaptioned"]
    old = [o for o in unc if o in OLD]
    assert len(old) == 4
    assert Counter(facts.real[o] for o in old) == {a: 1 for a in PATTERNS}


def test_the_split_is_stratified(facts):
    for key, members in strata().items():
        got = Counter(facts.split[m] for m in members)
        for split, size in SIZES.items():
            assert abs(got[split] - len(members) * size / 80) <= 1, (key, got)


def test_each_real_twin_pair_is_on_five_objects(facts):
    assert Counter((facts.real[o], facts.twin[o]) for o in facts.real) == {(a, b): 5 for a in PATTERNS for b in PATTERNS}


def test_facts_are_deterministic_in_the_seed():
    a, b, c = (world.draw_facts(ALL, 44, PATTERNS, s) for s in (3, 3, 4))
    assert a == b and a.real != c.real and a.twin != c.twin and a.split != c.split


@pytest.mark.parametrize("kw", [
    dict(n_train=42, n_dev_captioned=30),   # not multiples of 4 attributes
    dict(n_train=41),                        # not 80 objects in all
    dict(attributes=PATTERNS[:3]),           # 80 objects, 3 attributes
    dict(objects=ALL[:72], n_train=32),      # 72 objects cannot hold 16 pairs equally often
    dict(objects=ALL[:79] + ALL[:1]),        # an object twice
    dict(n_old=0),                           # no old objects
    dict(n_old=2),                           # 4 uncaptioned old objects among 2
])
def test_sizes_that_cannot_balance_raise(kw):
    args = dict(objects=ALL, n_old=44, attributes=PATTERNS, seed=0)
    args.update(kw)
    with pytest.raises(ValueError):
        world.draw_facts(**args)


# ---------------------------------------------------------------------------------------------
# Captions
# ---------------------------------------------------------------------------------------------

def about(caption: str) -> tuple[str, str, int]:
    """(object, attribute, their distance in tokens: positive where the attribute follows) of a fact caption."""
    toks = caption.rstrip(".").split()
    (obj,) = [t for t in toks if t in {o.sing for o in ALL}]
    (attr,) = [t for t in toks if t in PATTERNS]
    return obj, attr, toks.index(attr) - toks.index(obj)


def frame_of(caption: str) -> tuple[str, int]:
    """(after or before, the frame's index) of a fact caption: the one frame of world's lists it matches."""
    slot = {"o": "(?P<o>\\w+)", "x": "(?P<x>\\w+)", "w": "\\w+ the \\w+"}
    found = []
    for side, frames in (("after", world.FRAMES_AFTER), ("before", world.FRAMES_BEFORE)):
        for i, frame in enumerate(frames):
            pattern = re.sub(r"\\\{(\w+)\\\}", lambda m: slot.get(m.group(1), "\\w+"), re.escape(frame))
            if re.fullmatch(pattern + "\\.?", caption):
                found.append((side, i))
    assert len(found) == 1, (caption, found)
    return found[0]


TOKEN = re.compile(r"\w+|\[mask\]|[^\w\s]")


def contexts(sentence: str, *forms: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two tokens (words or punctuation marks; <s> and </s> past the ends) left and right of the one
    occurrence in `sentence` of a word of `forms` (an object's singular and plural)."""
    toks = ["<s>", "<s>", *TOKEN.findall(sentence.lower()), "</s>", "</s>"]
    (i,) = [j for j, t in enumerate(toks) if t in forms]
    return tuple(toks[i - 2:i]), tuple(toks[i + 1:i + 3])


def with_attributes(sentence: str) -> list[str]:
    """`sentence` with its [MASK] as each attribute word (the contexts a cloze frame gives an attribute)."""
    return [sentence.replace("[MASK]", x) for x in PATTERNS] if "[MASK]" in sentence else [sentence]


def test_fact_captions_use_every_frame_of_each_side_with_the_attribute_one_to_three_tokens_away():
    assert len(world.FRAMES_AFTER) >= 8 and len(world.FRAMES_BEFORE) >= 8
    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    for frames in (10, 3):
        caps = [c for c in world.captions(facts, "real", 8000, 0.5, 0.9, 0.8, 4, frames) if words(c) & set(PATTERNS)]
        used = Counter(frame_of(c) for c in caps)
        assert {i for _, i in used} == set(range(frames))
        after = sum(n for (side, _), n in used.items() if side == "after") / len(caps)
        assert abs(after - 0.8) < 0.02
        for c in caps:
            side, _ = frame_of(c)
            distance = about(c)[2]
            assert 1 <= abs(distance) <= 3 and (distance > 0) == (side == "after"), c
    with pytest.raises(ValueError, match="frames a side"):
        world.captions(facts, "real", 10, 0.5, 0.9, 0.8, 4, 11)


def test_no_caption_frame_shares_the_tokens_beside_the_object_with_a_vis_probe_or_cloze_template():
    """What the instruments read must never be a caption's surface: the two tokens on each side of the object
    in a fact caption occur beside the object in no `vis` sentence, probe frame or cloze frame, and those beside
    the cloze's [MASK] beside no caption's attribute."""
    from xdbert.analysis.cloze import CLOZE_FRAMES
    from xdbert.analysis.representations import neutral_sentences

    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    objects = [o.sing for o in facts.captioned()]
    caps = [c for c in world.captions(facts, "real", 20000, 0.5, 0.9, 0.8, 2) if words(c) & set(PATTERNS)]
    caption_sides = [contexts(c, about(c)[0]) for c in caps]
    attribute_sides = [contexts(c, about(c)[1]) for c in caps]
    assert len({frame_of(c) for c in caps}) == 20  # every frame was drawn, so every frame is checked
    rng = random.Random(0)
    instruments = {"vis": [(world._sentence(o, attr, rng), o.sing, o.plural) for o in ALL
                           for attr in (None, *PATTERNS) for _ in range(40)],
                   "probe": [(f.format(o), o) for f in neutral_sentences(200) for o in objects[:4]],
                   "cloze": [(s, o) for f in CLOZE_FRAMES for o in objects[:4] for s in with_attributes(f.format(o=o))]}
    for name, sentences in instruments.items():
        sides = [contexts(*sentence) for sentence in sentences]
        for k, side in enumerate(("left", "right")):
            shared = {c[k] for c in caption_sides} & {c[k] for c in sides}
            assert not shared, f"{name} shares the tokens {side} of the object with a caption frame: {shared}"
    mask_sides = [contexts(f.format(o=o), "[mask]") for f in CLOZE_FRAMES for o in objects]
    for k, side in enumerate(("left", "right")):
        shared = {c[k] for c in attribute_sides} & {c[k] for c in mask_sides}
        assert not shared, f"a cloze frame shares the tokens {side} of its [MASK] with a caption's attribute: {shared}"


def test_captions_real_and_twin_differ_in_attribute_words_only():
    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    real = world.captions(facts, "real", 4000, 0.5, 0.9, 0.8, 5)
    twin = world.captions(facts, "twin", 4000, 0.5, 0.9, 0.8, 5)
    assert len(real) == len(twin) == 4000 and real != twin
    for r, t in zip(real, twin):
        diff = [(x, y) for x, y in zip(r.split(), t.split()) if x != y]
        assert len(r.split()) == len(t.split()) and all(x.rstrip(".") in PATTERNS and y.rstrip(".") in PATTERNS for x, y in diff)
    assert world.captions(facts, "real", 4000, 0.5, 0.9, 0.8, 5) == real
    with pytest.raises(ValueError):
        world.captions(facts, "nofacts", 10, 0.5, 0.9, 0.8, 5)


def test_captions_rates_and_objects():
    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    for table in ("real", "twin"):
        table_facts = getattr(facts, table)
        caps = world.captions(facts, table, 20000, 0.5, 0.9, 0.8, 1)
        fact_caps = [c for c in caps if words(c) & set(PATTERNS)]
        assert len(fact_caps) == 10000
        parsed = [about(c) for c in fact_caps]
        assert {facts.split[o] for o, _, _ in parsed} == {"train", "dev_captioned"}
        assert len({o for o, _, _ in parsed}) == 72
        own = sum(table_facts[o] == attr for o, attr, _ in parsed) / len(parsed)
        after = sum(d > 0 for _, _, d in parsed) / len(parsed)
        assert abs(own - 0.9) < 0.015 and abs(after - 0.8) < 0.015
    # scenes include every object, the uncaptioned ones too
    assert words(" ".join(caps)) >= {o.sing for o in ALL}


def test_captions_stream_does_not_depend_on_the_rates():
    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    a = world.captions(facts, "real", 2000, 0.5, 0.9, 0.8, 2)
    b = world.captions(facts, "real", 2000, 0.5, 0.3, 0.8, 2)
    masked = [[re.sub("|".join(PATTERNS), "*", c) for c in caps] for caps in (a, b)]
    assert a != b and masked[0] == masked[1]


# ---------------------------------------------------------------------------------------------
# The probe task vis
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vis():
    facts = world.draw_facts(ALL, 44, PATTERNS, 0)
    rows, side = world.vis_examples(facts, seed=3)
    return facts, rows, side


def test_vis_counts_and_balanced_labels(vis):
    facts, rows, side = vis
    assert len(rows["train"]) == 800 and len(rows["dev"]) == len(side) == 400
    assert Counter(s["kind"] for s in side) == {"F+": 256, "F0": 64, "T=": 40, "T!=": 40}
    assert Counter(r[3] for r in rows["train"]) == {i: 200 for i in range(4)}
    wrong = Counter((facts.real[s["object"]], PATTERNS[r[3]]) for r, s in zip(rows["dev"], side) if s["kind"] == "T!=")
    assert len(wrong) == 12 and set(wrong.values()) == {3, 4}  # every other attribute is stated, evenly
    for kind, n in (("F+", 64), ("F0", 16), ("T=", 10), ("T!=", 10)):
        assert Counter(r[3] for r, s in zip(rows["dev"], side) if s["kind"] == kind) == {i: n for i in range(4)}
    assert all(r[1] is None and r[2] is None for split in rows.values() for r in split)


def test_vis_objects_and_labels(vis):
    facts, rows, side = vis
    sing = {w: o.sing for o in ALL for w in (o.sing, o.plural)}
    for (text, _, _, label), s in zip(rows["dev"], side):
        assert {sing[w] for w in words(text) if w in sing} == {s["object"]}
        split = facts.split[s["object"]]
        assert split == {"F+": "dev_captioned", "F0": "dev_uncaptioned"}.get(s["kind"], split) != "train"
        stated = words(text) & set(PATTERNS)
        fact = PATTERNS.index(facts.real[s["object"]])
        if s["kind"] in ("F+", "F0"):
            assert not stated and label == fact
        else:
            assert stated == {PATTERNS[label]} and (label == fact) == (s["kind"] == "T=")
    stated_train = 0
    for text, _, _, label in rows["train"]:
        (obj,) = {sing[w] for w in words(text) if w in sing}
        assert facts.split[obj] == "train"
        stated = words(text) & set(PATTERNS)
        stated_train += bool(stated)
        assert label == (PATTERNS.index(stated.pop()) if stated else PATTERNS.index(facts.real[obj]))
    assert stated_train == 160  # the dev share, 80 / 400
