"""The adaptation corpus: whole documents, from wiki103 on the hub (paper) or generated (embedded).

Output layout (what `stages/corpus.py` writes and `tokenize` reads)::

    data/corpus/train.parquet   doc_id: string, text: string (paragraphs joined by "\\n")
    data/corpus/valid.parquet   the same columns
    data/corpus/stats.json      documents, characters, words per split

One row is one DOCUMENT, kept whole: the paper adapts on long contiguous text (512-token BERT
windows cut from running articles), so nothing here splits or shuffles inside a document.

The second half of this module is the embedded profile's generator. Its word lists are the single
vocabulary of the embedded profile: `xdbert.tasks.generate` builds the task stand-ins from the same
lists, so a tokenizer trained on this corpus covers every task word and MLM pretraining on it has
seen every word the tasks use.
"""
from __future__ import annotations

import contextlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from xdbert.errors import PipelineError
from xdbert.hub import hub_request
from xdbert.io import atomic_path

SOURCES = ("generated", "hub")
SPLITS = ("train", "valid")
# wikitext's split names on the hub -> ours
HUB_SPLITS = {"train": "train", "valid": "validation"}
SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.string())])


# ---------------------------------------------------------------------------------------------
# Reading wiki103 from the hub
# ---------------------------------------------------------------------------------------------

# ` = Title = ` starts an article; ` = = Section = = ` (two or more '=') is a heading inside one.
_TITLE = re.compile(r"=\s(?!=)(.*?)(?<!=)\s=")
_HEADING = re.compile(r"(=\s)+.*?(\s=)+")
# wikitext escapes hyphens and separators inside numbers as " @-@ ", " @,@ ", " @.@ "; undone so
# both tokenizers see ordinary text ("1 @,@ 000" would otherwise cost five CLIP tokens).
_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def is_title(line: str) -> bool:
    """True for a top-level wikitext heading ` = Title = ` (exactly one '=' on each side)."""
    return _TITLE.fullmatch(line.strip()) is not None


def documents_from_lines(lines: Iterable[str]) -> Iterator[str]:
    """Regroup wikitext's one-row-per-line layout into whole articles.

    A new article starts at each title line. Headings (the title and ` = = Section = = ` lines) are
    dropped, like BERT's own Wikipedia preprocessing which keeps text passages only: a heading is a
    label, not a sentence, and would sit inside a 512-token window as a fragment. Empty lines are
    dropped; the remaining lines are the article's paragraphs, joined by "\\n". Lines before the
    first title (none in wiki103) form a document of their own rather than being lost.
    """
    paragraphs: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if is_title(line):
            if paragraphs:
                yield "\n".join(paragraphs)
            paragraphs = []
            continue
        if _HEADING.fullmatch(line):
            continue
        for old, new in _ESCAPES:
            line = line.replace(old, new)
        paragraphs.append(line)
    if paragraphs:
        yield "\n".join(paragraphs)


def load_hub_corpus(hub_id: str, hub_config: str, cache_dir: str | None = None) -> dict[str, list[str]]:
    """wiki103 (or any dataset with wikitext's layout: a `text` column of raw lines) as documents.

    `hub_id` is a hub id (`wikitext`) or a local folder in the hub's layout; both go through
    `datasets.load_dataset`, so tests exercise this exact code on files they write.
    """
    import datasets

    with hub_config_errors("corpus", hub_id, hub_config), hub_request(f"corpus `{hub_id}` ({hub_config}) from the hub"):
        ds = datasets.load_dataset(hub_id, hub_config, cache_dir=cache_dir)
    out: dict[str, list[str]] = {}
    for ours, theirs in HUB_SPLITS.items():
        if theirs not in ds:
            raise PipelineError(f"corpus `{hub_id}` ({hub_config}) has no split `{theirs}`; it has: {', '.join(ds)}")
        if "text" not in ds[theirs].column_names:
            raise PipelineError(f"corpus `{hub_id}` ({hub_config}) has no `text` column; columns: {', '.join(ds[theirs].column_names)}")
        column = ds[theirs].data.column("text")  # Arrow, read chunk by chunk: wiki103 has 1.8M lines
        out[ours] = list(documents_from_lines(line for chunk in column.chunks for line in chunk.to_pylist()))
    return out


@contextlib.contextmanager
def hub_config_errors(section: str, hub_id: str, config: str | None) -> Iterator[None]:
    """Turn `datasets`' "BuilderConfig 'x' not found" into a PipelineError naming the params to fix."""
    try:
        yield
    except ValueError as e:
        if "BuilderConfig" in str(e):
            raise PipelineError(f"`{hub_id}` has no config {config!r} (check the `{section}` params): {e}") from e
        raise


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def corpus_stats(docs: list[str]) -> dict[str, int]:
    """Documents, characters and whitespace-separated words of one split."""
    return {
        "documents": len(docs),
        "characters": sum(len(d) for d in docs),
        "words": sum(len(d.split()) for d in docs),
    }


def write_corpus(splits: dict[str, list[str]], out_dir: str | Path) -> dict[str, dict[str, int]]:
    """Write `<out_dir>/{train,valid}.parquet` and `stats.json` as one atomic directory."""
    for split in SPLITS:
        if not splits.get(split):
            raise PipelineError(f"the corpus has no documents in split `{split}`: check the `corpus` params (source, hub_id, hub_config, n_docs)")
    stats = {split: corpus_stats(splits[split]) for split in SPLITS}
    with atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            docs = splits[split]
            ids = [f"{split}-{i:07d}" for i in range(len(docs))]
            table = pa.Table.from_arrays([pa.array(ids, pa.string()), pa.array(docs, pa.string())], schema=SCHEMA)
            pq.write_table(table, tmp / f"{split}.parquet")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return stats


def read_corpus(path: str | Path) -> pa.Table:
    """One split written by `write_corpus` (doc_id, text)."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"missing corpus split {path}: run `dvc repro corpus` first")
    return pq.read_table(path)


# ---------------------------------------------------------------------------------------------
# The shared vocabulary of the embedded profile (corpus AND task stand-ins draw from it)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verb:
    """A verb with the forms the templates need, written out (no rule-based morphology)."""

    base: str
    s: str      # 3rd person singular present
    past: str
    pp: str     # past participle
    ing: str


def _verbs(spec: str) -> list[Verb]:
    return [Verb(*entry.split()) for entry in spec.strip().split(";")]


@dataclass(frozen=True)
class Noun:
    sing: str
    plural: str
    large: bool = False      # too large to throw, catch or carry in one hand
    buildable: bool = False  # things one builds or makes


@dataclass(frozen=True)
class Person:
    sing: str
    plural: str
    pron: str  # subject pronoun: he / she


@dataclass(frozen=True)
class Place:
    name: str
    prep: str  # in / at / on


COLOURS = ["red", "blue", "green", "yellow", "black", "white", "brown", "orange", "purple", "grey", "pink", "golden", "silver"]
SIZES = ["big", "small", "old", "new", "heavy", "tall", "long", "round", "shiny", "wooden"]

PERSONS = [Person(*p.split()) for p in (
    "man men he;woman women she;boy boys he;girl girls she;farmer farmers he;teacher teachers she;"
    "doctor doctors she;sailor sailors he;painter painters she;student students he;driver drivers he;"
    "cook cooks she;soldier soldiers he;fisherman fishermen he;baker bakers she;nurse nurses she;"
    "king kings he;queen queens she;musician musicians he;traveller travellers she;"
    "father fathers he;mother mothers she;child children she;stranger strangers he"
).split(";")]

ANIMALS = [Noun(*a.split()) for a in (
    "dog dogs;cat cats;horse horses;cow cows;sheep sheep;goat goats;bird birds;duck ducks;fox foxes;"
    "rabbit rabbits;bear bears;deer deer;mouse mice;owl owls;pig pigs"
).split(";")]

# Objects a scene can involve; `large` restricts throw/catch/kick, `buildable` allows build/make.
OBJECTS = [
    Noun("kite", "kites", buildable=True), Noun("ball", "balls"), Noun("book", "books"),
    Noun("cup", "cups"), Noun("bicycle", "bicycles", large=True), Noun("boat", "boats", large=True, buildable=True),
    Noun("guitar", "guitars"), Noun("cake", "cakes", buildable=True), Noun("apple", "apples"),
    Noun("hat", "hats"), Noun("shirt", "shirts"), Noun("umbrella", "umbrellas"), Noun("lamp", "lamps"),
    Noun("broom", "brooms"), Noun("knife", "knives"), Noun("camera", "cameras"),
    Noun("ladder", "ladders", large=True, buildable=True), Noun("bucket", "buckets"), Noun("candle", "candles"),
    Noun("blanket", "blankets"), Noun("letter", "letters"), Noun("map", "maps"), Noun("flower", "flowers"),
    Noun("bread", "loaves"), Noun("rope", "ropes"), Noun("key", "keys"),
    Noun("box", "boxes", buildable=True), Noun("basket", "baskets", buildable=True), Noun("bag", "bags"),
    Noun("bottle", "bottles"), Noun("chair", "chairs", large=True, buildable=True), Noun("clock", "clocks"),
    Noun("bench", "benches", large=True, buildable=True), Noun("flag", "flags"), Noun("mirror", "mirrors"),
    Noun("plate", "plates"), Noun("bowl", "bowls"), Noun("coat", "coats"), Noun("bell", "bells"),
    Noun("car", "cars", large=True), Noun("wagon", "wagons", large=True, buildable=True),
    Noun("tent", "tents", large=True, buildable=True), Noun("stone", "stones"), Noun("toy", "toys", buildable=True),
]

# What one does with an object, as a present-tense continuation of "<subject> ..." that refers to
# the object as "it". SWAG's endings are built from these: an ending is plausible only for an object
# whose own phrases include it. Objects in the same group share their phrases.
AFFORDANCES: dict[str, tuple[str, list[str]]] = {
    "kite": ("fly", ["flies it high above the trees", "lets it rise into the wind"]),
    "ball": ("kick", ["kicks it across the field", "throws it to a friend"]),
    "book": ("read", ["opens it and reads the first page", "reads it quietly by the window"]),
    "cup": ("drink", ["drinks the warm tea from it", "fills it with milk and drinks"]),
    "bicycle": ("ride", ["rides it down the road", "pedals it up the hill"]),
    "boat": ("row", ["rows it across the lake", "pushes it into the water and rows away"]),
    "guitar": ("music", ["plays a song on it", "tunes it and starts to sing"]),
    "cake": ("eat", ["cuts it into eight pieces", "eats a slice of it"]),
    "apple": ("eat", ["takes a big bite of it", "eats it slowly"]),
    "hat": ("wear", ["puts it on and looks in the mirror", "wears it to keep the sun away"]),
    "shirt": ("wear", ["puts it on and buttons it", "wears it to the party"]),
    "umbrella": ("rain", ["opens it as the rain starts", "holds it over the children in the rain"]),
    "lamp": ("light", ["switches it on to read", "turns it on in the dark room"]),
    "candle": ("light", ["lights it with a match", "lights it and watches the flame"]),
    "broom": ("sweep", ["sweeps the floor with it", "sweeps the dust away with it"]),
    "knife": ("cut", ["slices the bread with it", "cuts the rope with it"]),
    "camera": ("photo", ["takes a photo of the sunset with it", "points it at the birds and takes a picture"]),
    "ladder": ("climb", ["climbs it to reach the roof", "leans it against the wall and climbs up"]),
    "bucket": ("water", ["fills it with water from the well", "carries water in it to the garden"]),
    "blanket": ("fold", ["folds it and lays it on the bed", "wraps it around the sleeping child"]),
    "letter": ("post", ["seals it and posts it", "writes a name on it and posts it"]),
    "map": ("unfold", ["unfolds it to find the road", "studies it to find the way home"]),
    "flower": ("smell", ["smells it and smiles", "puts it in a vase of water"]),
    "key": ("lock", ["turns it in the lock", "unlocks the door with it"]),
}

PLACES = [Place(*p.split()) for p in (
    "park in;beach on;kitchen in;garden in;market at;station at;forest in;village in;harbour at;"
    "school at;church in;field in;farm on;street on;castle in;museum in;library in;lake at;hill on;"
    "mountain on;valley in;city in;town in;square in;road on;bridge on;island on;shop in;hospital at;"
    "palace in;theatre at;stadium at"
).split(";")]

VERBS = _verbs("""
carry carries carried carried carrying; hold holds held held holding; paint paints painted painted painting;
throw throws threw thrown throwing; push pushes pushed pushed pushing; pull pulls pulled pulled pulling;
wash washes washed washed washing; watch watches watched watched watching; find finds found found finding;
buy buys bought bought buying; sell sells sold sold selling; build builds built built building;
fix fixes fixed fixed fixing; drop drops dropped dropped dropping; lift lifts lifted lifted lifting;
catch catches caught caught catching; kick kicks kicked kicked kicking; draw draws drew drawn drawing;
clean cleans cleaned cleaned cleaning; hide hides hid hidden hiding; move moves moved moved moving;
bring brings brought brought bringing; take takes took taken taking; steal steals stole stolen stealing;
repair repairs repaired repaired repairing; purchase purchases purchased purchased purchasing;
discover discovers discovered discovered discovering; raise raises raised raised raising;
toss tosses tossed tossed tossing; construct constructs constructed constructed constructing;
grab grabs grabbed grabbed grabbing; seize seizes seized seized seizing; lose loses lost lost losing;
make makes made made making; pack packs packed packed packing; wrap wraps wrapped wrapped wrapping
""")
VERB = {v.base: v for v in VERBS}
# verbs that need a small object, and verbs that need a buildable one
SMALL_ONLY = {"throw", "catch", "kick", "toss", "hold", "grab", "seize", "wrap", "pack"}
BUILD_ONLY = {"build", "construct", "make"}

INTRANSITIVE = _verbs("""
run runs ran run running; sleep sleeps slept slept sleeping; sit sits sat sat sitting;
jump jumps jumped jumped jumping; swim swims swam swum swimming; walk walks walked walked walking;
wait waits waited waited waiting; sing sings sang sung singing; play plays played played playing;
rest rests rested rested resting; stand stands stood stood standing; laugh laughs laughed laughed laughing;
dance dances danced danced dancing; fly flies flew flown flying
""")

# True synonyms for re-wording (paraphrases, duplicate questions, STS-B): each pair is usable both ways.
VERB_SYNONYMS = {"buy": "purchase", "fix": "repair", "find": "discover", "lift": "raise",
                 "build": "construct", "grab": "seize", "wash": "clean"}
OBJECT_SYNONYMS = {"bicycle": Noun("bike", "bikes", large=True), "stone": Noun("rock", "rocks"),
                   "car": Noun("automobile", "automobiles", large=True)}
PERSON_SYNONYMS = {"child": Person("kid", "kids", "she"), "boy": Person("lad", "lads", "he")}
PLACE_SYNONYMS = {"shop": Place("store", "in"), "harbour": Place("port", "at")}
ADJ_SYNONYMS = {"big": "large", "small": "little"}



def _synonym_forms() -> dict[str, str]:
    """Every inflected form of every synonym pair, both directions: `bought` <-> `purchased`."""
    pairs: list[tuple[str, str]] = []
    for x, y in VERB_SYNONYMS.items():
        vx, vy = VERB[x], VERB[y]
        pairs += [(vx.base, vy.base), (vx.s, vy.s), (vx.past, vy.past), (vx.pp, vy.pp), (vx.ing, vy.ing)]
    for table in (OBJECT_SYNONYMS, PERSON_SYNONYMS):
        for x, y in table.items():
            nx = next(n for n in OBJECTS + PERSONS if n.sing == x)
            pairs += [(nx.sing, y.sing), (nx.plural, y.plural)]
    pairs += [(x, y.name) for x, y in PLACE_SYNONYMS.items()]
    pairs += list(ADJ_SYNONYMS.items())
    forms: dict[str, str] = {}
    for x, y in pairs:
        forms[x], forms[y] = y, x
    return forms


SYNONYM_FORMS = _synonym_forms()
_WORD = re.compile(r"[A-Za-z]+")


def reword(text: str, rng: random.Random, p: float = 0.5) -> str:
    """Replace each word that has a true synonym by it with probability `p` (case kept).

    Meaning is unchanged: the pairs are exact synonyms in every form the templates produce.
    """
    def swap(m: re.Match) -> str:
        w = m.group(0)
        alt = SYNONYM_FORMS.get(w.lower())
        if alt is None or rng.random() >= p:
            return w
        return cap(alt) if w[0].isupper() else alt

    return _WORD.sub(swap, text)


NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
TIMES = ["morning", "evening", "night", "winter", "summer", "spring", "autumn", "weekend"]
RELATIVES = ["sister", "brother", "friend", "neighbour", "son", "daughter", "uncle", "aunt"]
REASONS = ["it was cheap", "it was raining", "the market was closed", "a friend had asked", "the day was warm",
           "the old one was broken", "the festival was near"]

ABSTRACT_NOUNS = ["idea", "history", "theory", "policy", "freedom", "economy", "culture", "knowledge",
                  "government", "decision", "memory", "reason", "problem", "question", "value", "success",
                  "tradition", "science", "language", "religion", "society", "education", "power", "justice",
                  "law", "art", "future", "peace", "trade", "industry"]
ABSTRACT_VERBS = _verbs("""
influence influences influenced influenced influencing; shape shapes shaped shaped shaping;
change changes changed changed changing; describe describes described described describing;
explain explains explained explained explaining; support supports supported supported supporting;
discuss discusses discussed discussed discussing; consider considers considered considered considering;
study studies studied studied studying; reject rejects rejected rejected rejecting;
develop develops developed developed developing; improve improves improved improved improving;
affect affects affected affected affecting; challenge challenges challenged challenged challenging;
approve approves approved approved approving; open opens opened opened opening; close closes closed closed closing
""")
ABSTRACT_ADJS = ["important", "political", "social", "modern", "ancient", "public", "economic", "cultural",
                 "complex", "simple", "common", "general", "national", "local", "central", "early", "major", "recent"]
SETTLEMENTS = ["village", "town", "city", "valley", "island", "county", "province"]
INSTITUTIONS = ["council", "committee", "university", "company", "church", "government", "school board", "museum board"]
# what institutions build, open or close in the report genre
FACILITIES = [Noun(*f.split()) for f in (
    "school schools;bridge bridges;hospital hospitals;library libraries;road roads;park parks;"
    "station stations;museum museums;market markets;theatre theatres"
).split(";")]

# Sentiment words (SST-2) and the things people review.
POSITIVE = ["wonderful", "beautiful", "excellent", "delightful", "brilliant", "charming", "pleasant", "superb",
            "lovely", "enjoyable", "moving", "clever", "warm", "funny", "fresh", "gorgeous", "memorable"]
NEGATIVE = ["terrible", "awful", "boring", "dull", "ugly", "horrible", "poor", "disappointing", "weak",
            "tedious", "bland", "messy", "clumsy", "stale", "painful", "forgettable", "annoying"]
POSITIVE_VERBS = ["loved", "enjoyed", "admired", "praised"]
NEGATIVE_VERBS = ["hated", "disliked", "regretted", "criticised"]
REVIEWED = ["film", "book", "meal", "song", "play", "concert", "show", "story", "novel", "album", "hotel", "exhibition"]
ASPECTS = ["music", "ending", "acting", "plot", "service", "food", "dialogue", "lighting", "pace", "design"]

# Long, rare words: they raise the difficulty of a passage (READ) wherever they appear.
RARE_ADJS = ["meticulous", "ubiquitous", "ephemeral", "idiosyncratic", "quintessential", "magnanimous",
             "perfunctory", "labyrinthine", "indefatigable", "incongruous", "sanguine", "pernicious",
             "recalcitrant", "ostentatious", "inscrutable"]
RARE_ADVS = ["surreptitiously", "ostensibly", "inexorably", "assiduously", "ineluctably", "scrupulously",
             "ambivalently", "ceremoniously"]
RARE_NOUNS = ["juxtaposition", "paradigm", "dichotomy", "predicament", "proclivity", "vicissitude",
              "conundrum", "idiosyncrasy", "equanimity", "ambivalence", "circumspection", "magnificence"]
RARE_VERBS = _verbs("""
contemplate contemplates contemplated contemplated contemplating; scrutinize scrutinizes scrutinized scrutinized scrutinizing;
ameliorate ameliorates ameliorated ameliorated ameliorating; exacerbate exacerbates exacerbated exacerbated exacerbating;
promulgate promulgates promulgated promulgated promulgating; elucidate elucidates elucidated elucidated elucidating
""")
RARE_CONNECTIVES = ["Consequently", "Nevertheless", "Notwithstanding this", "Furthermore", "Accordingly"]
RARE_WORDS = frozenset(RARE_ADJS + RARE_ADVS + RARE_NOUNS + [w for v in RARE_VERBS for w in (v.base, v.s, v.past, v.ing)]
                       + ["consequently", "nevertheless", "notwithstanding", "furthermore", "accordingly"])


# ---------------------------------------------------------------------------------------------
# Small helpers the templates share (also used by the task generators)
# ---------------------------------------------------------------------------------------------

def a(word: str) -> str:
    """The indefinite article for `word`."""
    return "an" if word[0] in "aeiou" else "a"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def verbs_for(obj: Noun) -> list[Verb]:
    """Transitive verbs that make sense with `obj` (no throwing a car, no building an apple)."""
    out = []
    for v in VERBS:
        if v.base in SMALL_ONLY and obj.large:
            continue
        if v.base in BUILD_ONLY and not obj.buildable:
            continue
        out.append(v)
    return out


def year(rng: random.Random) -> int:
    return rng.randint(1850, 2015)


# ---------------------------------------------------------------------------------------------
# The generated corpus (embedded profile)
# ---------------------------------------------------------------------------------------------

class _Document:
    """One generated article: a setting, a cast and some props that every sentence draws on.

    Reusing the same few people, objects and their colours across thirty sentences is what makes the
    text coherent: a masked noun or colour can be recovered from an earlier mention, the kind of
    long-range evidence MLM on real articles provides.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.place = rng.choice(PLACES)
        self.places = rng.sample(PLACES, 3)
        self.cast = rng.sample(PERSONS, 3)
        self.props = rng.sample(OBJECTS, 4)
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

    TEMPLATES = (("active", 5), ("passive", 3), ("restate", 3), ("present", 4), ("describe", 3),
                 ("animal_scene", 1), ("animal_present", 1), ("affordance", 3), ("continuation", 2), ("history", 1),
                 ("report", 1), ("abstract", 2), ("opinion", 2), ("letter", 2), ("question", 2), ("seeing", 1),
                 ("quote", 1), ("negation", 1), ("rare", 1))

    def sentences(self, n: int) -> list[str]:
        names = [t for t, _ in self.TEMPLATES]
        weights = [w for _, w in self.TEMPLATES]
        out = []
        for _ in range(n):
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


def generate_corpus(n_docs: int, sentences_per_doc: int, seed: int) -> dict[str, list[str]]:
    """`n_docs` train documents and `n_docs // 10` (at least 1) valid documents; same seed, same bytes."""
    if not isinstance(n_docs, int) or n_docs <= 0:
        raise PipelineError(f"`corpus.n_docs` must be a positive integer; got {n_docs!r}")
    if not isinstance(sentences_per_doc, int) or sentences_per_doc <= 0:
        raise PipelineError(f"`corpus.sentences_per_doc` must be a positive integer; got {sentences_per_doc!r}")
    out = {}
    for split, n in (("train", n_docs), ("valid", max(1, n_docs // 10))):
        # string seeds hash deterministically (random.seed version 2), unlike hash()
        rng = random.Random(f"xdbert-corpus:{seed}:{split}")
        out[split] = [_Document(rng).text(sentences_per_doc) for _ in range(n)]
    return out


def load_corpus(source: str, *, hub_id: str = "", hub_config: str = "", n_docs: int = 0,
                sentences_per_doc: int = 0, seed: int = 0, cache_dir: str | None = None) -> dict[str, list[str]]:
    """Documents per split from the configured source (`generated` or `hub`)."""
    if source == "generated":
        docs = generate_corpus(n_docs, sentences_per_doc, seed)
    elif source == "hub":
        docs = load_hub_corpus(hub_id, hub_config, cache_dir=cache_dir)
    else:
        raise PipelineError(f"unknown corpus.source {source!r}; allowed: {', '.join(SOURCES)}")
    for split in SPLITS:
        if not docs.get(split):
            raise PipelineError(f"the corpus from source `{source}` has no documents in split `{split}` (no text lines found); check `corpus` params")
    return docs
