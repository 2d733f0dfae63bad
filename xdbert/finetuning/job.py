"""A finetuning job: one model and one task, tokenized once, picklable for the worker pool.

`prepare` reads the model's config, takes Table 5's learning rate for its family's size class (for CLIP-T,
its width's) and tokenizes every split once with fast batched tokenizers; `build_model` gives each seed a
fresh model with a new head.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from xdbert import imports, io, paths
from xdbert.data.shards import sha256_file
from xdbert.data.tasks.registry import TaskSpec
from xdbert.data.tokenization.vocab import check_tokenizer_folder
from xdbert.errors import PipelineError
from xdbert.finetuning import data as fd
from xdbert.finetuning.heads import (ClipTowerClassifier, EncoderClassifier, FullModelClassifier, RowSubsetEmbedding,
                                     encoder_head_class)
from xdbert.finetuning.runs import MODEL_KINDS
from xdbert.finetuning.settings import FinetuneSettings, Hyperparameters, size_of
from xdbert.model.settings import Family


@dataclass
class Job:
    """Everything a worker needs for one (model, task): picklable, tokenized once."""

    model_kind: str                      # encoder, clip or full (`finetuning.runs`)
    model_path: str
    spec: TaskSpec
    hyperparameters: Hyperparameters
    data: dict[str, fd.Encoded]          # "train" and every dev split
    eot_id: int = 49407
    size: str = "base"                   # Table 5's size class the learning rate was taken for
    identity: str = ""                   # hash of the model's files and the tokenized data (`job_identity`)
    run_cache: str = ""                  # where finished runs are kept by what decided them (`grid`); "" = nowhere

    @property
    def dev_splits(self) -> tuple[str, ...]:
        return self.spec.dev_splits


def prepare(model_kind: str, model_path: str | Path, tables: dict, settings: FinetuneSettings,
            tokenizer_dir: str | Path | None = None, run_cache: str | Path = "", protocol: str = "table1",
            family: Family | None = None) -> Job:
    """Read the model's config and tokenize every split of `settings.task` once (fast batched tokenizers).

    encoder: the tokenizer saved in the model folder. full: the BERT tokenizer in `tokenizer_dir`
    (the cross-modal folder holds none) and CLIP blocks. clip: CLIP blocks only. The `family` (None for
    CLIP-T) gives Table 5's size class and the layer-wise lr decay; without one, the model's width decides the
    size and the decay is off. Finished runs are kept in `run_cache` ("" = nowhere).
    """
    from transformers import AutoConfig, AutoTokenizer

    spec = settings.task
    if model_kind not in MODEL_KINDS:
        raise PipelineError(f"unknown model kind {model_kind!r}; allowed: {', '.join(MODEL_KINDS)}")
    model_path = Path(model_path)
    data: dict[str, fd.Encoded] = {}
    if model_kind == "full" and tokenizer_dir is None:
        raise PipelineError("the full cross-modal model keeps no tokenizer: pass tokenizer_dir (models/tokenizer)")
    if model_kind in ("encoder", "full"):
        tok_dir = model_path if model_kind == "encoder" else Path(tokenizer_dir)
        check_tokenizer_folder(tok_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        except (OSError, ValueError) as e:
            raise PipelineError(f"cannot load a tokenizer from {tok_dir} ({e}); run the stage that writes it") from e
        if not tokenizer.is_fast:
            raise PipelineError(f"the tokenizer in {tok_dir} is not a fast (Rust) tokenizer; save one with tokenizer.json")
        encoder_dir = model_path if model_kind == "encoder" else model_path / "encoder"
        encoder_config = AutoConfig.from_pretrained(encoder_dir)
        width = encoder_config.hidden_size
        fd.check_positions("finetune.max_len", settings.max_len, encoder_config, encoder_dir)
        data = {split: fd.encode_bert(tokenizer, spec, t, settings.max_len) for split, t in tables.items()}

    eot_id = 49407
    # Model code is imported here, once: workers forked later inherit it instead of each paying seconds.
    if model_kind == "encoder":
        encoder_head_class(model_path, spec)
    else:
        from xdbert.model import saving  # noqa: F401  (preloaded for the workers: open_clip, the cross-modal model)

        if model_kind == "full":
            clip_name = io.read_json(model_path / paths.CROSSMODAL_CONFIG)["clip"]
        else:
            import open_clip

            from xdbert.clip import register_configs

            clip_name = io.read_json(model_path / paths.CLIP_CONFIG)["clip"]
            register_configs()
            width = open_clip.get_model_config(clip_name)["text_cfg"]["width"]
        to_blocks, eot_id = fd.clip_block_encoder(clip_name)
        for split, t in tables.items():
            blocks = fd.encode_clip(to_blocks, spec, t, settings.clip_blocks_per_sentence)  # uint16
            if model_kind == "clip":
                data[split] = fd.Encoded(idx=t.column("idx").to_numpy().astype(np.int64), labels=fd.labels_of(spec, t),
                                         choices=blocks.shape[1], inputs={}, pad_ids={})
            data[split].clip_ids = blocks
    size = family.size if family else size_of(width)
    hyperparameters = settings.hyperparameters(size, model_kind, protocol, family.layer_lr_decay if family else 1.0)
    job = Job(model_kind, str(model_path), spec, hyperparameters, data, eot_id, size,
              run_cache=str(run_cache) if run_cache else "")
    job.identity = job_identity(job)
    return job


# Modules the grid imports that compute nothing a run returns: a change to them keeps every saved run
LOG_ONLY = {"progress.py": "prints the grid's plan and progress lines"}


def code_files() -> list[Path]:
    """The code a run executes: the modules the grid runs (`xdbert.imports.closure` of grid.py) less
    LOG_ONLY, and the source of the MKL library that picks the CPU's kernels (xdbert.numerics)."""
    grid = Path(__file__).resolve().with_name("grid.py")
    log_only = {grid.with_name(name) for name in LOG_ONLY}
    return sorted([*(imports.closure(grid) - log_only), imports.ROOT / imports.PACKAGE / "mkl_dispatch.c"])


@functools.cache
def code_digest() -> str:
    """A hash of `code_files` and the versions of torch and transformers. A change to any of them makes
    every saved run stale; one to a report, an analysis or the adaptation does not."""
    import transformers

    h = hashlib.sha256(f"torch {torch.__version__} transformers {transformers.__version__}\n".encode())
    for path in code_files():
        h.update(f"{path.relative_to(imports.ROOT)}:{sha256_file(path)}\n".encode())
    return h.hexdigest()[:16]


@functools.cache
def _file_digest(path: Path, inode: int, size: int, mtime_ns: int) -> str:
    """A file's sha256, read once per (inode, size, mtime), as DVC's own state keeps it: every task's jobs
    hash the same model folders, gigabytes in the paper profile."""
    return sha256_file(path)


def job_identity(job: Job) -> str:
    """A hash of what a run's result depends on besides the hyperparameters and the seed: the code, the
    model kind, the task, every file of the model folder and the tokenized data. A saved run is reused only
    if it matches."""
    h = hashlib.sha256(f"{code_digest()} {job.model_kind} {job.spec.name} {job.eot_id}\n".encode())
    root = Path(job.model_path)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{_file_digest(path, st.st_ino, st.st_size, st.st_mtime_ns)}\n".encode())
    for split in sorted(job.data):
        d = job.data[split]
        arrays = [d.idx, d.labels, *(a for name in sorted(d.inputs) for a in (d.inputs[name].flat, d.inputs[name].offsets))]
        for a in arrays + ([] if d.clip_ids is None else [d.clip_ids]):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def model_parameters(model_path: str | Path) -> int:
    """The parameters of a saved model, counted from the fp32 safetensors files the pipeline saves."""
    return sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors")) // 4


# A run reads a few rows of a token-embedding table per token, so the table takes memory but next to no
# compute: CLIP's 49,408 rows are 97% of the embedded CLIP stand-in and would make its runs look 30x dearer.
EMBEDDING_TABLES = ("word_embeddings.weight", "token_embedding.weight")


def compute_parameters(model_path: str | Path) -> int:
    """The parameters a run's compute grows with: a saved model's, less its token-embedding tables (read
    from the safetensors headers, no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for file in Path(model_path).glob("*.safetensors"):
        with safe_open(file, "np") as f:
            total += sum(int(np.prod(f.get_slice(name).get_shape())) for name in f.keys()
                         if not name.endswith(EMBEDDING_TABLES))
    return total


def clip_token_ids(job: Job) -> np.ndarray:
    """Every CLIP id in the job's splits (padding, [SOT] and [EOT] included)."""
    return np.unique(np.concatenate([np.unique(d.clip_ids) for d in job.data.values()]))


def build_model(job: Job) -> nn.Module:
    """The model of `job.model_kind` with a fresh task head (initialised from the current torch RNG)."""
    if job.model_kind == "encoder":
        return EncoderClassifier(job.model_path, job.spec)
    from xdbert.model.saving import load_clip_tower, load_full

    if job.model_kind == "full":
        model = FullModelClassifier(load_full(job.model_path), job.spec, job.hyperparameters.dropout)
        tower = model.xd.clip  # the CLIPTC decoder tied to its embedding was dropped with the heads
    else:
        tower, _ = load_clip_tower(job.model_path)
        model = ClipTowerClassifier(tower, job.spec, job.hyperparameters.clip_blocks_per_sentence,
                                    job.hyperparameters.dropout, job.eot_id)
    tower.token_embedding = RowSubsetEmbedding(tower.token_embedding, clip_token_ids(job))
    return model
