"""The mirror's files for the visual-knowledge probes (xdbert.mirror; ../shared/PROBES.md), in the real layouts
with made-up rows:

- CoDa: its JSON-lines files, one per split, rows object x template (made-up objects, colour distributions and
  templates of both template groups; `--sizes paper`: the real objects per split and templates per group), the
  ClassLabel columns as ids;
- ViComTe's files of a relation, which users hand-provide under `probes.vicomte_dir`: the class words with a few
  synonyms, the distributions, both groupings' splits and the templates (`--sizes paper`: the real files' examples
  per split and templates per relation, which bench/probes_stage.py times; `xdbert rehearse` writes them small).
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
                      "a close-up photo of {plural}.", "a sketch of a {sing}.", "a bright photo of the {plural}.",
                      "a dark photo of a {sing}.", "a cropped photo of some {plural}.", "a painting of the {sing}.",
                      "a toy {sing}."),
    "text-masked": ("Most {plural} are {mask}.", "This {sing} is {mask}.", "Many {plural} are {mask}.",
                    "Usually {plural} are {mask}.", "Every {sing} is {mask}.", "We all know that {plural} are {mask}.",
                    "Often a {sing} is {mask}.", "In general {plural} are {mask}.", "People say most {plural} are {mask}.",
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
VICOMTE_SYNONYMS = {"color": (("azure", "blue"), ("grey", "gray")), "shape": (("circle", "round"),),
                    "material": (("wooden", "wood"), ("copper", "bronze"))}



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
    paper sizes: the real objects per split and templates per group."""
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
            for idx, (template, template_group) in enumerate(templates):
                rows.append({"class_id": f"/m/rehearsal_{split}_{i}", "display_name": noun.plural.capitalize(),
                             "ngram": noun.sing, "label": [round(float(x), 6) for x in label], "object_group": group,
                             "text": template.format(sing=noun.sing, plural=noun.plural, mask=layout["mask"]),
                             "template_group": features["template_group"].index(template_group), "template_idx": idx})
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_vicomte(folder: Path, relation: str, seed: int, sizes: str) -> None:
    """ViComTe's files of `relation` under `folder`, in the layout of the authors' repository (xdbert.data.vicomte):
    its class words and a few of their synonyms; made-up subjects (`made_up_objects`), counts whose top class is
    each subject's `obj`, and templates. Paper sizes: the real files' examples per group and split and templates per
    relation, every class a subject's `obj`."""
    import numpy as np

    rng = np.random.default_rng([seed, vicomte.RELATIONS.index(relation)])
    classes, synonyms = VICOMTE_CLASSES[relation], VICOMTE_SYNONYMS[relation]
    paths = dict(zip(vicomte.FILES, vicomte.files(folder, relation)))
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    # the class words in order, each synonym after its class; the real file ends without a newline
    lines = [line for c in classes for line in [c, *(f"{word}: {c}" for word, target in synonyms if target == c)]]
    paths["words"].write_text("\n".join(lines), encoding="utf-8")
    paper = sizes == "paper"
    templates = VICOMTE_PAPER_TEMPLATES[relation] if paper else [f"the {relation} of the [X] is [Y] .", "[X] is [Y] .", "a [Y] [X] ."]
    paths["templates"].write_text("".join(json.dumps({"template": t}) + "\n" for t in templates), encoding="utf-8")
    n_rows = VICOMTE_PAPER_ROWS[relation] if paper else VICOMTE_ROWS
    n_all = n_rows["all"]
    subjects = [noun.sing for noun in made_up_objects(sum(n_all.values()), sizes)]
    drawn = classes if paper else classes[:4]  # a linear probe at paper sizes fits every class
    objs = [classes[i % 2] if i < 2 else str(rng.choice(drawn)) for i in range(len(subjects))]  # two classes at least
    counts = {}
    for subject, obj in zip(subjects, objs):
        row = rng.integers(0, 50, len(classes))
        row[classes.index(obj)] = row.max() + 1 + rng.integers(0, 20)
        counts[subject] = [int(c) for c in row]
    paths["distributions"].write_text(json.dumps(counts), encoding="utf-8")
    rows = [{"sub": s, "obj": o, "alt": next(c for c in reversed(classes) if c != o)} for s, o in zip(subjects, objs)]
    by_split = {"train": rows[:n_all["train"]], "test": rows[n_all["train"]:]}
    for group in vicomte.GROUPS:  # the single group: a subset of the objects of all groups
        for split, part in by_split.items():
            part = part[:n_rows[group][split]]
            paths[f"{group}/{split}"].write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
