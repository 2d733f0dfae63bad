"""The mirror's files for the visual-knowledge probes (xdbert.mirror; ../shared/PROBES.md), in the real layouts
with made-up rows:

- CoDa: its JSON-lines files, one per split, rows object x template (made-up objects, colour distributions and
  templates of both template groups; `--sizes paper`: the real objects per split and templates per group), the
  ClassLabel columns as ids;
- ViComTe's files of a relation, which users hand-provide under `probes.vicomte_dir`: the class words with a few
  synonyms, the distributions, both groupings' splits and the templates (`--sizes paper`: the real files' examples
  per split and templates per relation, which bench/probes_stage.py times; `xdbert rehearse` writes them small);
  and ViComTe's CoDa templates, as many as the real file holds, in the project's own words.

Both with the quirks of the real files (read in github ChenyuHeidiZhang/VL-commonsense @ f111efc and CoDa's export):
a word list in alphabetical order, synonyms interleaved ("amber: orange" first), and word and template files without
a final newline; a class that occurs in test alone (shape: `polygon`, one subject) and classes no subject has
(`semicircle`, `jade`); subjects whose counts tie `obj` with another class at the top; heavily skewed classes (shape:
about three in four `round`); CoDa objects without a singular form, with the rows of the templates that need none.
"""
from __future__ import annotations

import json
from pathlib import Path

from xdbert.data import vicomte

# CoDa: objects per split (--sizes paper: the real counts, xdbert.hub_layouts) and made-up templates per template
# group, with {sing}, {plural} and {mask}: paper sizes as many per group as the real templates.yaml, tiny the first two
CODA_OBJECTS = {"train": 6, "validation": 3, "test": 3}
CODA_PAPER_TEMPLATES = {
    "clip-imagenet": ("a photo of a {sing}.", "a drawing of some {plural}.", "a blurry photo of the {sing}.",
                      "a close-up photo of {plural}.", "a sketch of some {plural}.", "a bright photo of the {plural}.",
                      "a dark photo of a {sing}.", "a cropped photo of some {plural}.", "a painting of the {plural}.",
                      "a toy {sing}."),
    "text-masked": ("Most {plural} are {mask}.", "This {sing} is {mask}.", "Many {plural} are {mask}.",
                    "Usually {plural} are {mask}.", "Every {sing} is {mask}.", "We all know that {plural} are {mask}.",
                    "Often {plural} are {mask}.", "In general {plural} are {mask}.", "People say most {plural} are {mask}.",
                    "A typical {sing} is {mask}."),
}
CODA_TEMPLATES = {group: templates[:2] for group, templates in CODA_PAPER_TEMPLATES.items()}
# ViComTe: examples per group and split (--sizes paper: the real files', ../shared/PROBES.md); each relation's class
# words in the order of its counts (the authors' WORD_LISTS in probing/models.py at f111efc) and a few synonyms from
# its word list, (synonym, class); templates (--sizes paper: as many as the authors' files hold, in their style)
VICOMTE_ROWS = {"all": {"train": 16, "test": 8}, "single": {"train": 8, "test": 4}}
VICOMTE_PAPER_ROWS = {
    "color": {"all": {"train": 2303, "test": 574}, "single": {"train": 1029, "test": 252}},
    "shape": {"all": {"train": 566, "test": 140}, "single": {"train": 418, "test": 101}},
    "material": {"all": {"train": 1139, "test": 284}, "single": {"train": 730, "test": 192}},
}
VICOMTE_PAPER_TEMPLATES = {
    "color": ("[X] is [Y] .", "[X] are [Y] .", "the color of [X] is [Y] .", "[X] is [Y] in color .",
              "[X] has the color [Y] .", "a [Y] [X] .", "[X] is usually [Y] ."),
    "shape": ("[X] is [Y] .", "[X] are [Y] .", "the shape of [X] is [Y] .", "[X] is [Y] in shape .",
              "[X] has a [Y] shape .", "a [Y] [X] .", "[X] is usually [Y] ."),
    "material": ("[X] is made of [Y] .", "[X] are made of [Y] .", "the [X] is made of [Y] .", "[X] is made from [Y] .",
                 "the material of [X] is [Y] .", "a [Y] [X] .", "[X] is usually made of [Y] ."),
}
VICOMTE_CLASSES = {
    "color": ("black", "blue", "brown", "gray", "green", "orange", "pink", "purple", "red", "silver", "white", "yellow"),
    "shape": ("cross", "heart", "octagon", "oval", "polygon", "rectangle", "rhombus", "round", "semicircle", "square",
              "star", "triangle"),
    "material": ("bronze", "ceramic", "cloth", "concrete", "cotton", "denim", "glass", "gold", "iron", "jade", "leather",
                 "metal", "paper", "plastic", "rubber", "stone", "tin", "wood"),
}
VICOMTE_SYNONYMS = {"color": (("amber", "orange"), ("azure", "blue"), ("grey", "gray")), "shape": (("circle", "round"),),
                    "material": (("wooden", "wood"), ("copper", "bronze"))}
# the real files' quirks: per relation its most frequent class and about its share of the subjects (PROBES.md's
# majority lines), a class of one test subject that train lacks, the classes no subject has; every TIE-th subject's
# counts tie its `obj` with another class at the top
VICOMTE_MAJORITY = {"color": ("white", 0.375), "shape": ("round", 0.736), "material": ("wood", 0.292)}
VICOMTE_TEST_ONLY = {"shape": "polygon"}
VICOMTE_NEVER = {"shape": ("semicircle",), "material": ("jade",)}
VICOMTE_TIE = 5
# ViComTe's CoDa templates: as many as the real coda.jsonl, made up in its shape (most name the subject as a plural,
# which the singular [X] fills, "duck are mostly [Y] .": the real file's quirk; one as a singular)
VICOMTE_CODA_TEMPLATES = (
    "[X] are mostly [Y] .", "[X] are usually [Y] .", "Most often [X] are [Y] .", "As a rule [X] are [Y] .",
    "We all know [X] are [Y] .", "People say that [X] are [Y] .", "In general [X] are [Y] .", "Typically [X] are [Y] .",
    "A [X] is usually [Y] .")
# CoDa: every CODA_NO_SINGULAR-th object has no singular form (its ngram the plural), and rows of the templates
# without {sing} alone: 13 of 20 at paper sizes, as in CoDa's files
CODA_NO_SINGULAR = 3



def made_up_objects(count: int, sizes: str) -> list:
    """`count` distinct made-up objects (xdbert.data.synthetic.words.Noun): the generators' nouns (tiny), or each of
    them after a size and a colour, "small red kite" (paper: enough for ViComTe's 2,877 colour subjects)."""
    from itertools import product

    from xdbert.data.synthetic.words import COLOURS, EXTRA_OBJECTS, OBJECTS, SIZES as ADJECTIVES, Noun

    nouns = OBJECTS + EXTRA_OBJECTS
    if sizes == "paper":
        nouns = [Noun(f"{size} {colour} {n.sing}", f"{size} {colour} {n.plural}") for size, colour, n in product(ADJECTIVES, COLOURS, nouns)]
    if count > len(nouns):
        raise ValueError(f"{count} made-up objects asked for; the {sizes} mirror has {len(nouns)}")
    return nouns[:count]


def write_coda(folder: Path, layout: dict, seed: int, sizes: str) -> None:
    """CoDa's data files in their layout (xdbert.hub_layouts): one JSON-lines file per split, rows object x template,
    ordered by the template's text as the authors' export orders them, the ClassLabel columns as ids (the mirror
    writes the repository's other files as placeholders). Made-up objects (`made_up_objects`), distributions and templates of both template groups;
    paper sizes: the real objects per split and templates per group. An object without a singular form
    (`CODA_NO_SINGULAR`) has the rows of the templates that need none alone, its template_idx those templates'."""
    import numpy as np

    rng = np.random.default_rng(seed)
    features = dict(layout["features"])
    counts = layout["objects"] if sizes == "paper" else CODA_OBJECTS
    by_group = CODA_PAPER_TEMPLATES if sizes == "paper" else CODA_TEMPLATES
    templates = sorted((text, group) for group, texts in by_group.items() for text in texts)
    nouns = iter(made_up_objects(sum(counts.values()), sizes))
    for split, path in layout["data_files"].items():
        rows = []
        for i, noun in zip(range(counts[split]), nouns):
            label = rng.dirichlet(np.full(len(layout["colors"]), 0.5))
            group = int(rng.integers(len(features["object_group"])))
            singular = i % CODA_NO_SINGULAR != CODA_NO_SINGULAR - 1
            for idx, (template, template_group) in enumerate(templates):
                if not singular and "{sing}" in template:
                    continue
                rows.append({"class_id": f"/m/rehearsal_{split}_{i}", "display_name": noun.plural.capitalize(),
                             "ngram": noun.sing if singular else noun.plural, "label": [round(float(x), 6) for x in label],
                             "object_group": group,
                             "text": template.format(sing=noun.sing, plural=noun.plural, mask=layout["mask"]),
                             "template_group": features["template_group"].index(template_group), "template_idx": idx})
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_vicomte(folder: Path, relation: str, seed: int, sizes: str) -> None:
    """ViComTe's files of `relation` under `folder`, in the layout of the authors' repository (xdbert.data.vicomte):
    its class words and a few of their synonyms; made-up subjects (`made_up_objects`), their classes
    (`vicomte_classes`), counts whose top class is each subject's `obj` (every VICOMTE_TIE-th tied with another), and
    templates, with the real files' quirks (the module's docstring). Paper sizes: the real files' examples per group
    and split and templates per relation."""
    import numpy as np

    rng = np.random.default_rng([seed, vicomte.RELATIONS.index(relation)])
    classes, synonyms = VICOMTE_CLASSES[relation], VICOMTE_SYNONYMS[relation]
    paths = dict(zip(vicomte.FILES, vicomte.files(folder, relation)))
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    # every word in alphabetical order, synonyms among the classes ("amber: orange" before "black"), as the real
    # files; the classes keep their order, alphabetical too. Neither this file nor the templates ends with a newline
    lines = sorted([*classes, *(f"{word}: {target}" for word, target in synonyms)], key=lambda line: line.split(":")[0])
    paths["words"].write_text("\n".join(lines), encoding="utf-8")
    paper = sizes == "paper"
    templates = VICOMTE_PAPER_TEMPLATES[relation] if paper else [f"the {relation} of the [X] is [Y] .", "[X] is [Y] .", "a [Y] [X] ."]
    paths["templates"].write_text("\n".join(json.dumps({"template": t}) for t in templates), encoding="utf-8")
    n_rows = VICOMTE_PAPER_ROWS[relation] if paper else VICOMTE_ROWS
    n_all = n_rows["all"]
    subjects = [noun.sing for noun in made_up_objects(sum(n_all.values()), sizes)]
    objs = vicomte_classes(relation, len(subjects), n_all["train"], paper, rng)
    counts = {}
    for i, (subject, obj) in enumerate(zip(subjects, objs)):
        row = rng.integers(0, 50, len(classes))
        top = classes.index(obj)
        row[top] = row.max() + 1 + rng.integers(0, 20)
        if i % VICOMTE_TIE == VICOMTE_TIE - 1:  # a tie at the top, with a class before `obj` where there is one
            row[top - 1 if top else top + 1] = row[top]
        counts[subject] = [int(c) for c in row]
    paths["distributions"].write_text(json.dumps(counts), encoding="utf-8")
    rows = [{"sub": s, "obj": o, "alt": next(c for c in reversed(classes) if c != o)} for s, o in zip(subjects, objs)]
    by_split = {"train": rows[:n_all["train"]], "test": rows[n_all["train"]:]}
    for group in vicomte.GROUPS:  # the single group: a subset of the objects of all groups
        for split, part in by_split.items():
            part = part[:n_rows[group][split]]
            paths[f"{group}/{split}"].write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")


def write_vicomte_coda(folder: Path) -> None:
    """ViComTe's CoDa templates file under `folder` (xdbert.data.vicomte.coda_templates_file): VICOMTE_CODA_TEMPLATES,
    one JSON object a line, without a final newline, as the real templates files."""
    path = vicomte.coda_templates_file(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps({"template": t}) for t in VICOMTE_CODA_TEMPLATES), encoding="utf-8")


def vicomte_classes(relation: str, n: int, n_train: int, paper: bool, rng) -> list[str]:
    """The `obj` of each of `n` subjects, the first `n_train` train: the relation's majority class at its real
    share, the first two subjects two other classes (a probe needs two classes in train), the rest drawn from the
    classes (tiny: the first four); none of `VICOMTE_NEVER`; `VICOMTE_TEST_ONLY`'s class the first test subject's
    alone (both groupings' test splits start with it)."""
    classes = VICOMTE_CLASSES[relation]
    majority, share = VICOMTE_MAJORITY[relation]
    test_only, never = VICOMTE_TEST_ONLY.get(relation), VICOMTE_NEVER.get(relation, ())
    others = [c for c in (classes if paper else classes[:4]) if c not in (majority, test_only, *never)]
    objs = [others[0], others[1]]
    for i in range(2, n):  # the majority class at its share of every run of subjects, so of every split
        objs.append(majority if int((i + 1) * share) > int(i * share) else str(rng.choice(others)))
    if test_only:
        objs[n_train] = test_only
    return objs
