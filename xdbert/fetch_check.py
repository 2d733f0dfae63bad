"""`xdbert fetch --check`: every asset the params name, loaded once the way its stage loads it, before any stage runs.

A real hub asset can differ from what the loaders expect in ways that show only hours in (an encoder that starts
partly random, a label order that scores every prediction against the wrong class, a cut-short weights file).
Each check below calls the stage's own loader on the snapshot hub.lock.json pins (`xdbert.hub.source`), so it
fails where the stage would, in seconds:

- each encoder (`model.encoder`, every family's): loaded with no missing weight; its MLM head found where its
  family ships one (BERT), absent by design where it does not (ELECTRA's discriminators); its tokenizer holding
  `model.encoder`'s vocabulary id for id;
- CLIP's text tower, its pinned weights loaded strictly;
- each dataset: the stage's loader, then its label names against the task registry's and the first rows of every split;
- wiki103: on a sample of its first rows, the article rule (one article per title line, no heading or number
  escape left) and the share of windows that overflow the CLIP blocks, against `tokenize.max_overflow`;
- CoDa, read by its loader (xdbert.data.coda), and the probes' reference encoder, as every encoder above;
- the hand-provided files, read as their stages read them (ViComTe's a relation at a time).

One table says what passed; a failure is a `PipelineError` naming each failed asset and what was found.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xdbert import params as P
from xdbert.data import provided, vicomte
from xdbert.errors import PipelineError
from xdbert.fetch import hub_assets, provided_files
from xdbert.random_encoder import RANDOM_PREFIX

# Families whose pretrained checkpoints ship no MLM head (xdbert.model.encoders): ELECTRA's discriminators.
NO_MLM_HEAD = ("electra",)
FIRST_ROWS = 3          # rows of every split read back
SAMPLE_ROWS = 20_000    # wiki103 train rows the article rule and the overflow share are measured on (about 300 articles: wiki103 has 63 lines per article)


@dataclass(frozen=True)
class Row:
    asset: str
    passed: bool
    checked: str        # what was checked, or what failed


# ----------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------

def check_encoder(name: str, families: list[str], reference: str) -> str:
    """`name` loads with every weight; its MLM head is where its family has one; the vocabulary of `families`'
    encoder is `reference`'s (`model.encoder`'s, which writes the token shards they read)."""
    from xdbert.data.tokenization.vocab import check_shared_vocabulary, load_encoder_tokenizer
    from xdbert.model.encoders import build_language_encoder, load_pretrained_mlm_head
    from xdbert.model.layers import MaskedTokenHead

    encoder = build_language_encoder(name)  # raises on a missing weight
    model_type = encoder.config.model_type
    found = load_pretrained_mlm_head(name, MaskedTokenHead(encoder.config.hidden_size, encoder.get_input_embeddings()))
    expected = model_type not in NO_MLM_HEAD
    if found != expected:
        raise PipelineError(f"expected {'its' if expected else 'no'} pretrained MLM head ({model_type}), found "
                            f"{'one' if found else 'none'}")
    head = "MLM head found" if found else f"no MLM head ({model_type}: absent by design)"
    vocab = len(load_encoder_tokenizer(name))
    same = ""
    if families and name != reference and not reference.startswith(RANDOM_PREFIX):  # a random one's is trained later
        check_shared_vocabulary(name, families[0], reference)
        same = f", = `{reference}`'s id for id"
    return (f"{model_type}, {sum(p.numel() for p in encoder.parameters()):,} parameters, no weight missing; {head}; "
            f"tokenizer {vocab:,} tokens{same}")


def check_clip(name: str, pretrained: str) -> str:
    from xdbert.clip import pinned_clip_weights
    from xdbert.model.clip_tower import CLIPTextTower

    tower = CLIPTextTower.build(name, pretrained)  # open_clip loads the checkpoint strictly
    return f"{name} text tower, width {tower.width}, from {Path(pinned_clip_weights(name, pretrained)).name} (strict)"


# ----------------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------------

def load_hub_dataset(hub_id: str, config: str | None):
    """What the stages' loaders call (xdbert.data.tasks.hub, xdbert.data.corpus); served from `datasets`' cache
    once the loader has run."""
    import datasets

    from xdbert.hub import source

    return datasets.load_dataset(source(hub_id, "dataset"), config)


def first_rows(ds, columns: list[str]) -> str:
    """Every split of `ds` has rows, and its first ones a value in each of `columns`."""
    for split, part in ds.items():
        rows = part.select(range(min(FIRST_ROWS, len(part)))).to_list()
        empty = [(i, c) for i, row in enumerate(rows) for c in columns if row.get(c) in (None, "")]
        if not rows or empty:
            raise PipelineError(f"split `{split}`: expected {FIRST_ROWS} first rows with {columns}, found "
                                f"{'no rows' if not rows else f'row {empty[0][0]} without `{empty[0][1]}`'}")
    return ", ".join(f"{s} {len(part):,}" for s, part in ds.items())


def label_names(ds, task: str) -> str:
    """The dataset's label names are the task registry's, in order (a regression label is a float)."""
    from datasets import ClassLabel

    from xdbert.data.tasks.registry import get_task

    spec = get_task(task)
    feature = next(iter(ds.values())).features["label"]
    if spec.kind == "regression":
        if isinstance(feature, ClassLabel) or not feature.dtype.startswith("float"):
            raise PipelineError(f"{task}: expected a float `label`, found {feature}")
        return "float label"
    expected = list(spec.label_names or (str(i) for i in range(spec.num_labels)))
    found = feature.names if isinstance(feature, ClassLabel) else feature
    if found != expected:
        raise PipelineError(f"{task}: expected label names {expected} (xdbert.data.tasks.registry), found {found}")
    return f"labels {'/'.join(expected)}"


def check_glue(hub_id: str, task: str) -> str:
    from xdbert.data.tasks.hub import GLUE, load_glue

    load_glue(task, hub_id)
    config, *columns = GLUE[task]
    ds = load_hub_dataset(hub_id, config)
    return f"{config}: {label_names(ds, task)}; rows: {first_rows(ds, [c for c in columns if c] + ['label'])}"


def check_swag(hub_id: str) -> str:
    from xdbert.data.tasks.hub import SWAG_CONFIG, load_swag

    load_swag(hub_id)
    ds = load_hub_dataset(hub_id, SWAG_CONFIG)
    columns = ["sent1", "sent2", *(f"ending{i}" for i in range(4)), "label"]
    return f"{SWAG_CONFIG}: {label_names(ds, 'swag')}; rows: {first_rows(ds, columns)}"


def overflow_share(docs: list[str], p: dict) -> float:
    """The share of the dual tokenizer's windows over `docs` whose text overflows the CLIP blocks, with the
    `tokenize` settings and the tokenizers the `dual_tokenize` stage uses."""
    from xdbert.clip import clip_tokenizer
    from xdbert.data.tokenization.build import Settings
    from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
    from xdbert.data.tokenization.dual import DualTokenizer
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.data.tokenization.windows import Layout

    model = P.section(p, "model")
    settings = Settings.from_params(P.section(p, "tokenize"))
    bert, clip = load_encoder_tokenizer(model["encoder"]), clip_tokenizer(model["clip"])
    layout = Layout(max_len=settings.max_len, n_blocks=settings.n_blocks, cls_id=bert.cls_token_id, sep_id=bert.sep_token_id,
                    pad_id=bert.pad_token_id, sot_id=clip.sot_token_id, eot_id=clip.eot_token_id, bert_vocab_size=len(bert))
    windows = DualTokenizer(bert.backend_tokenizer.to_str(), clip_fast_tokenizer(model["clip"]).to_str(), layout).encode(docs)
    return float(windows.overflow.mean())


def check_corpus(hub_id: str, config: str, p: dict) -> str:
    """The corpus stage's loader, then on the first `SAMPLE_ROWS` train lines: one article per title line with no
    heading or number escape left in it, and the CLIP-block overflow share."""
    from xdbert.data.corpus import documents_from_lines, is_title, load_hub_corpus

    docs = load_hub_corpus(hub_id, config)
    ds = load_hub_dataset(hub_id, config)
    rows = first_rows(ds, [])  # wikitext's rows start blank: every split has some
    lines = ds["train"].select(range(min(SAMPLE_ROWS, len(ds["train"]))))["text"]
    sample = list(documents_from_lines(lines))
    titles = sum(is_title(line.strip()) for line in lines)
    leftover = next((d for d in sample for marker in (" = = ", " @-@ ", " @.@ ", " @,@ ") if marker in d), None)
    if len(sample) != titles or leftover is not None:
        raise PipelineError(f"expected one article per title line with no heading or escape left, found {len(sample)} "
                            f"articles for {titles} titles" + (f" and {leftover[:60]!r}" if leftover else ""))
    limit = P.section(p, "tokenize")["max_overflow"]
    share = "not measured (a random encoder's vocabulary is trained by `dual_tokenize`)"
    if not P.section(p, "model")["encoder"].startswith(RANDOM_PREFIX):
        measured = overflow_share(sample, p)
        if measured > limit:
            raise PipelineError(f"expected at most {limit:.2%} of the windows to overflow the CLIP blocks "
                                f"(`tokenize.max_overflow`), found {measured:.2%} on the first {len(sample)} articles")
        share = f"{measured:.2%} (limit {limit:.2%})"
    return (f"{config}: articles train {len(docs['train']):,}, valid {len(docs['valid']):,} (the WikiText paper's "
            f"wiki103: 28,475 and 60); rows: {rows}; sample of {len(sample)} articles: one per title, "
            f"CLIP-block overflow {share}")


def check_read(path: str, p: dict) -> str:
    from xdbert.data.tasks.hub import load_read

    tasks = P.section(p, "tasks")
    split = load_read(path, tasks["read_dev_fraction"], P.section(p, "model")["seed"])
    return f"read as the tasks stage reads it: train {split['train'].num_rows:,}, dev {split['dev'].num_rows:,} rows"


def check_captions(path: Path) -> str:
    return f"{len(provided.read_coco_captions(path)):,} captions"


def check_vicomte(folder: Path, relation: str) -> str:
    from xdbert.data.vicomte import CODA, load_coda_templates, load_relation

    if relation == CODA:
        return f"{len(load_coda_templates(folder))} templates for CoDa"
    r = load_relation(folder, relation)
    splits = "; ".join(f"{group} " + ", ".join(f"{split} {len(rows):,}" for split, rows in r.splits[group].items())
                       for group in r.splits)
    return (f"{len(r.classes)} classes ({sum(len(w) - 1 for w in r.synonyms.values())} synonyms), {len(r.templates)} "
            f"templates, counts of {len(r.distributions):,} subjects; {splits}")


def check_coda(hub_id: str) -> str:
    from xdbert.data.coda import load_coda

    splits = load_coda(hub_id)
    return "rows (objects): " + ", ".join(f"{split} {len(rows):,} ({len({r.class_id for r in rows}):,})"
                                           for split, rows in splits.items())


# ----------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------

def checks(p: dict) -> list[tuple[str, Callable[[], str]]]:
    """(asset, check) for every asset params `p` name, in stage order."""
    model, tasks = P.section(p, "model"), P.section(p, "tasks")
    out: list[tuple[str, Callable[[], str]]] = []
    relations = []
    for key, path in provided_files(p):
        if key == "tasks.read_path":
            out.append((f"{path} (`{key}`)", lambda path=str(path): check_read(path, p)))
        elif key == provided.VICOMTE:  # one row per relation (its checks span its files), one for the CoDa templates
            relation = vicomte.locate(path)
            if relation not in relations:
                relations.append(relation)
                out.append((f"{relation[0]} {relation[1]} (`{key}`)", lambda r=relation: check_vicomte(*r)))
        else:
            out.append((f"{path} (`{key}`)", lambda path=path: check_captions(path)))
    families: dict[str, list[str]] = {}
    for asset in hub_assets(p):
        label = f"{asset.repo_id} (`{asset.key}`)"
        if asset.key == "corpus.hub_id":
            out.append((label, lambda a=asset: check_corpus(a.repo_id, P.section(p, "corpus")["hub_config"], p)))
        elif asset.key == "tasks.glue_hub_id":
            out += [(f"{asset.repo_id} {task} (`{asset.key}`)", lambda a=asset, t=task: check_glue(a.repo_id, t))
                    for task in tasks["names"] if task not in ("swag", "read")]
        elif asset.key == "tasks.swag_hub_id":
            out.append((label, lambda a=asset: check_swag(a.repo_id)))
        elif asset.key == "tasks.read_path":
            out.append((label, lambda a=asset: check_read(a.repo_id, p)))
        elif asset.key == "probes.coda_hub_id":
            out.append((label, lambda a=asset: check_coda(a.repo_id)))
        elif asset.key == "model.clip_pretrained":
            out.append((label, lambda: check_clip(model["clip"], model["clip_pretrained"])))
        elif asset.repo_type == "model":
            families[asset.repo_id] = []
            out.append((label, lambda a=asset: check_encoder(a.repo_id, families[a.repo_id], model["encoder"])))
        # a captions dataset (`grounding.captions`: a hub id) is read by the grounding stage alone; not checked here
    for name, entry in P.section(p, "families").items():
        encoder = entry.get("encoder", model["encoder"])
        if encoder in families:
            families[encoder].append(name)
    return out


def table(rows: list[Row]) -> str:
    lines = ["| asset | result | checked |", "| --- | --- | --- |"]
    lines += [f"| {r.asset} | {'PASS' if r.passed else 'FAIL'} | {r.checked} |" for r in rows]
    return "\n".join(lines)


def one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if isinstance(e, PipelineError) else f"expected it to load, found {type(e).__name__}: {text}"


def check_assets(p: dict, say: Callable[[str], None] = print) -> list[Row]:
    """Run every check of params `p`, print the table; a `PipelineError` naming every asset that failed."""
    from xdbert.hub import quiet_loading

    rows = []
    for asset, check in checks(p):
        try:
            with quiet_loading():
                rows.append(Row(asset, True, check()))
        except Exception as e:  # any loader's failure on this asset, reported with the others
            rows.append(Row(asset, False, one_line(e)))
    say(table(rows) if rows else "no hub asset or hand-provided file to check")
    failed = [r for r in rows if not r.passed]
    if failed:
        raise PipelineError("; ".join(f"{r.asset}: {r.checked}" for r in failed))
    return rows
