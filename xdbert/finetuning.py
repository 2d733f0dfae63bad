"""Finetuning one model on one task for several seeds: the paper's GLUE / SWAG / READ protocol.

Read top to bottom:

1. `FinetuneSettings`, `learning_rate` - the hyperparameters (paper Table 5 learning rates).
2. Three model kinds behind one interface, `forward(batch) -> scores (B, outputs)`:
   - `encoder`: a `save_pretrained` folder (BERT, ELECTRA, the adapted XDBERT) with its family's own
     transformers head: `AutoModelForSequenceClassification` (problem_type regression for STS-B and
     READ) or `AutoModelForMultipleChoice` (SWAG).
   - `clip`: CLIP's text tower alone (Table 1's CLIP-T row), see `ClipTowerClassifier`.
   - `full`: the whole cross-modal model (Table 8), see `FullModelClassifier`.
3. `parameter_groups` - AdamW groups with the optional layer-wise learning-rate decay.
4. `prepare`, `train_seed`, `run_grid` - tokenize once, train each seed, spread all runs over one pool;
   with `Job.checkpoint_dir` set, each finished seed is saved there, so a killed grid resumes.
5. `results`, `write_results` - per-seed metrics, medians over seeds, per-example predictions.

Randomness is a pure function of the seed: the new head's initial weights, the batch order of each
epoch and the dropout of each step are seeded from (seed, position), so the same seed gives the same
predictions (on the CPU, with the same number of threads), and different seeds differ.
"""
from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import hashlib
import inspect
import math
import multiprocessing
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

from xdbert import finetune_data as fd
from xdbert import io, training
from xdbert.errors import PipelineError
from xdbert.shards import sha256_file
from xdbert.tasks.metrics import compute_metrics
from xdbert.tasks.registry import TaskSpec

KINDS = ("encoder", "clip", "full")
LARGE_WIDTH = 1024          # Table 5: "large" models (BERT-l, ELECTRA-l) are 1024 wide


# ----------------------------------------------------------------------------------------------------
# 1. Settings
# ----------------------------------------------------------------------------------------------------

@dataclass
class FinetuneSettings:
    """One run's hyperparameters (the `finetune` params section, with the task's learning rate chosen)."""

    lr: float
    epochs: int = 3
    warmup_ratio: float = 0.1
    batch_size: int = 32
    eval_batch_size: int = 128
    max_len: int = 128
    weight_decay: float = 0.01
    layer_lr_decay: float = 1.0       # 1.0 = off; 0.9 = each layer below the top gets lr * 0.9^depth
    max_grad_norm: float = 1.0
    length_group: int = 50            # batches per length-sorted mega-batch; 1 = plain shuffled batches
    clip_blocks_per_sentence: int = 2  # Table 8: 2 blocks for one sentence, 4 for a pair
    dropout: float = 0.1              # before the new head of the clip and full kinds
    precision: str = "auto"           # auto = bf16 autocast on a GPU, fp32 on the CPU
    compile: bool = False             # torch.compile the model (lengths dynamic); pays off on long GPU runs


def learning_rate(table: dict, spec: TaskSpec, size: str, kind: str = "encoder") -> float:
    """`table[task][size]`: the paper's Table 5 written out per task, so one task's rate can change alone.

    The full cross-modal model (Table 8, whose rates the paper does not give) takes `table[task]["full"]`
    where the task has one, else the same rate as the encoder.
    """
    try:
        if kind == "full" and "full" in table[spec.name]:
            return float(table[spec.name]["full"])
        return float(table[spec.name][size])
    except (KeyError, TypeError) as e:
        raise PipelineError(f"`finetune.lr` needs `{spec.name}: {{{size}: <lr>}}` (Table 5: base 1e-4 for RTE, "
                            f"MRPC, STS-B and 2e-5 for the others; large 5e-5 and 1e-5)") from e


def size_of(width: int) -> str:
    """Table 5's model size from the hidden width: large at 1024 and above, else base."""
    return "large" if width >= LARGE_WIDTH else "base"


# ----------------------------------------------------------------------------------------------------
# 2. Models
# ----------------------------------------------------------------------------------------------------

def outputs_of(spec: TaskSpec) -> int:
    """Scores per (example or choice): classes, 1 for regression, 1 per choice for multiple choice."""
    return 1 if spec.kind in ("regression", "multiple_choice") else spec.num_labels


def encoder_head_class(path: str | Path, spec: TaskSpec) -> type:
    """The transformers class with the encoder family's own head for `spec` (imports its modeling code)."""
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise PipelineError(f"cannot read the encoder config in {path} ({e}); it must be a save_pretrained folder") from e
    mc = spec.kind == "multiple_choice"
    mapping = modeling_auto.MODEL_FOR_MULTIPLE_CHOICE_MAPPING if mc else modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING
    try:
        return mapping[type(config)]
    except KeyError:
        head = "multiple-choice" if mc else "sequence-classification"
        raise PipelineError(f"model type `{config.model_type}` in {path} has no {head} head in transformers; "
                            "use an encoder such as BERT, ELECTRA or RoBERTa") from None


class EncoderClassifier(nn.Module):
    """A transformers encoder with its family's own task head, loaded from a `save_pretrained` folder."""

    def __init__(self, path: str | Path, spec: TaskSpec):
        super().__init__()
        from transformers.utils import logging as hf_logging

        cls = encoder_head_class(path, spec)
        kwargs = {} if spec.kind == "multiple_choice" else {
            "num_labels": outputs_of(spec),
            "problem_type": "regression" if spec.kind == "regression" else "single_label_classification"}
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()  # "newly initialized: classifier" is the point of finetuning
        hf_logging.disable_progress_bar()  # one bar per seed would fill the stage's log
        try:
            self.model = cls.from_pretrained(path, **kwargs)
        except (OSError, ValueError) as e:
            raise PipelineError(f"cannot load encoder folder {path} ({e}); it must be a save_pretrained folder") from e
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
        self.width = self.model.config.hidden_size
        accepted = inspect.signature(self.model.forward).parameters
        self.input_names = [n for n in ("input_ids", "token_type_ids", "attention_mask") if n in accepted]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**{k: batch[k] for k in self.input_names if k in batch}).logits


def _flat(x: torch.Tensor, trailing: int) -> torch.Tensor:
    """Merge the leading (batch[, choice]) dimensions: (..., *trailing dims) -> (N, *trailing dims)."""
    return x.reshape(-1, *x.shape[x.dim() - trailing:])


def _unflat(scores: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """(N, outputs) back to (B, outputs), or to (B, choices) for multiple choice (one score per choice)."""
    return scores.reshape(*lead, -1).squeeze(-1) if len(lead) > 1 else scores


class FullModelClassifier(nn.Module):
    """The full cross-modal model (Table 8): classify from the language [CLS] after the cross layers.

    The pretraining heads are dropped. The new head is BERT's: dense + tanh (a pooler), dropout, linear;
    the pooler starts from the encoder's own pretrained pooler when it has one (BERT does, ELECTRA
    does not), because the cross layers now sit between the encoder and the head. Token type ids are
    passed to the encoder, so a sentence pair reads as it does in the `encoder` kind. Everything is
    trained, the CLIP tower included, except CLIP's `text_projection` and `logit_scale`, which no
    path reaches.
    """

    def __init__(self, xd: nn.Module, spec: TaskSpec, dropout: float):
        super().__init__()
        for head in ("mlm_head", "match_head", "cliptc_head"):
            setattr(xd, head, None)
        if not xd.config.uses_clip:
            raise PipelineError("this cross-modal model has no cross layers (the MLM-only baseline); finetune it as an `encoder`")
        self.xd = xd
        enc = xd.encoder.config
        self.width = enc.hidden_size
        self.pool = nn.Linear(self.width, self.width)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(self.width, outputs_of(spec))
        std = getattr(enc, "initializer_range", 0.02)
        for layer in (self.pool, self.out):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)
        pooler = getattr(xd.encoder, "pooler", None)
        if isinstance(getattr(pooler, "dense", None), nn.Linear):
            self.pool.load_state_dict(pooler.dense.state_dict())
            xd.encoder.pooler = None  # its output is unused: skip computing it
        frozen = {id(p) for p in xd.clip.unused_parameters()} if xd.clip is not None else set()
        for p in self.parameters():
            p.requires_grad_(id(p) not in frozen)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        lead = batch["input_ids"].shape[:-1]
        ids, mask = _flat(batch["input_ids"], 1), _flat(batch["attention_mask"], 1)
        types = _flat(batch["token_type_ids"], 1) if "token_type_ids" in batch else None
        language, _ = self.xd.encode(ids, mask, _flat(batch["clip_ids"], 2), token_type_ids=types, language_cls_only=True)
        scores = self.out(self.dropout(torch.tanh(self.pool(language[:, 0]))))
        return _unflat(scores, lead)


class ClipTowerClassifier(nn.Module):
    """CLIP's text tower alone (CLIP-T), finetuned with a linear head.

    Input: each sentence in its own `blocks_per_sentence` CLIP blocks ([SOT] + 75 + [EOT]). A sentence
    is the mean of the [EOT] features (after ln_final, as CLIP pools, without the projection that was
    trained for the image loss) of its used blocks. A pair (u, v) is read as [u, v, |u - v|, u * v]
    (Sentence-BERT's features), because a linear head on [u, v] alone cannot compare the two sentences,
    which paraphrase, similarity and inference need. SWAG scores each (context, ending) pair with one
    output and compares the four.
    """

    def __init__(self, tower: nn.Module, spec: TaskSpec, blocks_per_sentence: int, dropout: float, eot_id: int):
        super().__init__()
        self.tower, self.eot_id = tower, eot_id
        self.pair, self.k = spec.pair, blocks_per_sentence
        self.width = tower.width
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(self.width * (4 if spec.pair else 1), outputs_of(spec))
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        from xdbert.clip import clip_block_mask

        clip_ids = batch["clip_ids"]
        lead = clip_ids.shape[:-2]
        ids = _flat(clip_ids, 2)                                   # (N, n_blocks, 77)
        n, n_blocks, context = ids.shape
        mask = clip_block_mask(ids, self.eot_id)
        x = self.tower(ids, mask).reshape(n, n_blocks, context, -1)
        eot = (mask.sum(-1) - 1).clamp(min=0)                      # mask runs from [SOT] to the first [EOT]
        pooled = x.gather(2, eot[..., None, None].expand(-1, -1, 1, x.shape[-1])).squeeze(2)
        used = mask.any(-1).to(pooled.dtype)
        sentences = n_blocks // self.k
        pooled, used = pooled.reshape(n, sentences, self.k, -1), used.reshape(n, sentences, self.k, 1)
        sent = (pooled * used).sum(2) / used.sum(2).clamp(min=1)   # (N, sentences, W)
        if self.pair:
            u, v = sent[:, 0], sent[:, 1]
            features = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
        else:
            features = sent[:, 0]
        return _unflat(self.out(self.dropout(features)), lead)


# ----------------------------------------------------------------------------------------------------
# 3. Optimizer groups
# ----------------------------------------------------------------------------------------------------

_LAYER = re.compile(r"^(.*)\.(?:layer|resblocks)\.(\d+)\.")


def layer_depths(names: list[str]) -> dict[str, int]:
    """How far below the top each parameter sits: the basis of layer-wise learning-rate decay.

    Per stack of numbered layers (`<stack>.layer.N.` as in BERT/ELECTRA/RoBERTa, `<stack>.resblocks.N.`
    in CLIP), layer N of L has depth L - N: the top layer 1, layer 0 L. The stack's embeddings (any
    parameter with `embedding` in its name under the module that holds the stack) have depth L + 1.
    Everything else - task heads, poolers, the cross layers above the encoder, final LayerNorms - is
    depth 0 and keeps the full rate. In the full model the encoder and CLIP stacks count separately.
    """
    stacks: dict[str, int] = {}
    for name in names:
        m = _LAYER.match(name)
        if m:
            stacks[m.group(1)] = max(stacks.get(m.group(1), 0), int(m.group(2)) + 1)
    depths = {}
    for name in names:
        m = _LAYER.match(name)
        if m:
            depths[name] = stacks[m.group(1)] - int(m.group(2))
            continue
        depths[name] = 0
        parts = name.split(".")
        hit = next((i for i, p in enumerate(parts) if "embedding" in p), None)
        if hit is not None:
            owner = ".".join(parts[:hit])
            # the stack under the same module: `bert` holds `bert.encoder`, CLIP's tower holds `transformer`
            owned = [s for s in stacks if owner == "" or s == owner or s.startswith(owner + ".")]
            if owned:
                depths[name] = stacks[min(owned, key=len)] + 1
    return depths


def parameter_groups(model: nn.Module, lr: float, weight_decay: float, layer_lr_decay: float = 1.0) -> list[dict]:
    """AdamW groups: lr * layer_lr_decay ** depth, no weight decay on biases and LayerNorm weights."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    depths = layer_depths([n for n, _ in named])
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in named:
        decay = p.ndim >= 2
        key = (depths[name], decay)
        if key not in groups:
            groups[key] = {"params": [], "names": [], "lr": lr * layer_lr_decay ** depths[name],
                           "weight_decay": weight_decay if decay else 0.0}
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


# ----------------------------------------------------------------------------------------------------
# 4. Training
# ----------------------------------------------------------------------------------------------------

@dataclass
class Job:
    """Everything a worker needs for one (model, task): picklable, tokenized once."""

    kind: str
    model_path: str
    spec: TaskSpec
    settings: FinetuneSettings
    data: dict[str, fd.Encoded]          # "train" and every dev split
    eot_id: int = 49407
    width: int = 0
    identity: str = ""                   # hash of the model's files and the tokenized data (`job_identity`)
    checkpoint_dir: str = ""             # where finished seeds are kept until the results are written; "" = nowhere

    @property
    def dev_splits(self) -> tuple[str, ...]:
        return self.spec.dev_splits


def prepare(kind: str, model_path: str | Path, spec: TaskSpec, tables: dict, settings: FinetuneSettings,
            tokenizer_dir: str | Path | None = None) -> Job:
    """Read the model's config and tokenize every split once (fast batched tokenizers).

    encoder: the tokenizer saved in the model folder. full: the BERT tokenizer in `tokenizer_dir`
    (the cross-modal folder holds none) and CLIP blocks. clip: CLIP blocks only.
    """
    from transformers import AutoConfig, AutoTokenizer

    if kind not in KINDS:
        raise PipelineError(f"unknown model kind {kind!r}; allowed: {', '.join(KINDS)}")
    model_path = Path(model_path)
    data: dict[str, fd.Encoded] = {}
    if kind == "full" and tokenizer_dir is None:
        raise PipelineError("the full cross-modal model keeps no tokenizer: pass tokenizer_dir (models/tokenizer)")
    if kind in ("encoder", "full"):
        tok_dir = model_path if kind == "encoder" else Path(tokenizer_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        except (OSError, ValueError) as e:
            raise PipelineError(f"cannot load a tokenizer from {tok_dir} ({e}); run the stage that writes it") from e
        if not tokenizer.is_fast:
            raise PipelineError(f"the tokenizer in {tok_dir} is not a fast (Rust) tokenizer; save one with tokenizer.json")
        data = {split: fd.encode_bert(tokenizer, spec, t, settings.max_len) for split, t in tables.items()}

    eot_id = 49407
    # Model code is imported here, once: workers forked later inherit it instead of each paying seconds.
    if kind == "encoder":
        width = AutoConfig.from_pretrained(model_path).hidden_size
        encoder_head_class(model_path, spec)
    else:
        from xdbert import modeling  # open_clip and the cross-modal model

        if kind == "full":
            clip_name = io.read_json(model_path / "xdbert_config.json")["clip"]
            width = AutoConfig.from_pretrained(model_path / "encoder").hidden_size
        else:
            import open_clip

            from xdbert.clip import register_configs

            clip_name = io.read_json(model_path / modeling.CLIP_CONFIG_FILE)["clip"]
            register_configs()
            width = open_clip.get_model_config(clip_name)["text_cfg"]["width"]
        to_blocks, eot_id = fd.clip_block_encoder(clip_name)
        for split, t in tables.items():
            blocks = fd.encode_clip(to_blocks, spec, t, settings.clip_blocks_per_sentence)  # uint16
            if kind == "clip":
                data[split] = fd.Encoded(idx=t.column("idx").to_numpy().astype(np.int64), labels=fd.labels_of(spec, t),
                                         choices=blocks.shape[1], inputs={}, pad_ids={})
            data[split].clip_ids = blocks
    job = Job(kind, str(model_path), spec, settings, data, eot_id, width)
    job.identity = job_identity(job)
    return job


def job_identity(job: Job) -> str:
    """A hash of what a run's result depends on besides the settings and the seed: the kind, the task,
    every file of the model folder and the tokenized data. A saved seed is reused only if it matches."""
    h = hashlib.sha256(f"{job.kind} {job.spec.name} {job.eot_id}\n".encode())
    root = Path(job.model_path)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root)}:{sha256_file(path)}\n".encode())
    for split in sorted(job.data):
        d = job.data[split]
        arrays = [d.idx, d.labels, *(a for name in sorted(d.inputs) for a in (d.inputs[name].flat, d.inputs[name].offsets))]
        for a in arrays + ([] if d.clip_ids is None else [d.clip_ids]):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


class RowSubsetEmbedding(nn.Module):
    """The rows `ids` of embedding table `full`, looked up by their original ids.

    A finetuning run reads only the CLIP tokens of its task's text, a few thousand of CLIP's 49,408. The
    other rows cannot change any output, yet the optimizer, gradient clipping and the dense embedding
    gradient touch every row at every step: in the embedded profile the table is 84% of the full
    model's parameters and cost about a sixth of its step (measured on QNLI). Keeping only the rows the
    task's splits use gives the same outputs for them; the parameter keeps the name `weight`.
    """

    def __init__(self, full: nn.Embedding, ids: np.ndarray):
        super().__init__()
        ids = torch.as_tensor(np.unique(ids).astype(np.int64))
        self.weight = nn.Parameter(full.weight.detach()[ids].clone(), requires_grad=full.weight.requires_grad)
        lookup = torch.full((full.num_embeddings,), -1, dtype=torch.long)  # -1: not kept (an index error)
        lookup[ids] = torch.arange(len(ids))
        self.register_buffer("lookup", lookup, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(self.lookup[ids], self.weight)


def clip_token_ids(job: Job) -> np.ndarray:
    """Every CLIP id in the job's splits (padding, [SOT] and [EOT] included)."""
    return np.unique(np.concatenate([np.unique(d.clip_ids) for d in job.data.values()]))


def build_model(job: Job) -> nn.Module:
    """The model of `job.kind` with a fresh task head (initialised from the current torch RNG)."""
    if job.kind == "encoder":
        return EncoderClassifier(job.model_path, job.spec)
    from xdbert.modeling import load_clip_tower, load_full

    if job.kind == "full":
        model = FullModelClassifier(load_full(job.model_path), job.spec, job.settings.dropout)
        tower = model.xd.clip  # the CLIPTC decoder tied to its embedding was dropped with the heads
    else:
        tower, _ = load_clip_tower(job.model_path)
        model = ClipTowerClassifier(tower, job.spec, job.settings.clip_blocks_per_sentence, job.settings.dropout, job.eot_id)
    tower.token_embedding = RowSubsetEmbedding(tower.token_embedding, clip_token_ids(job))
    return model


def task_loss(spec: TaskSpec, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over classes or choices; mean squared error for regression (as transformers' heads)."""
    scores = scores.float()
    if spec.kind == "regression":
        return F.mse_loss(scores.reshape(-1), labels.float())
    return F.cross_entropy(scores, labels)


def pad_multiple(settings: FinetuneSettings, device: torch.device) -> int:
    """What batch lengths are rounded up to. On a GPU 8: bf16 tensor cores want it, and it bounds the
    distinct batch shapes at max_len / 8. cuDNN's attention builds a plan the first time a process meets
    a shape (about 1 s each on an H100, measured), which made one seed of 500 RTE examples with exact
    lengths 4x slower than a Trainer that pads everything to 128. On the CPU 1: exact lengths are
    fastest there (rounding to 8 cost 15% on the tiny model) and keep the CPU results as they were. A
    max_len that is no multiple of 8 keeps exact lengths, so no batch grows beyond it."""
    return 8 if device.type == "cuda" and settings.max_len % 8 == 0 else 1


def _to_device(batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def predict(model: nn.Module, job: Job, data: fd.Encoded, device: torch.device, autocast) -> np.ndarray:
    """Predicted class / choice (int64) or score (float64) of every example, in the split's order."""
    model.eval()
    out: np.ndarray | None = None
    multiple = pad_multiple(job.settings, device)
    for rows in fd.eval_batches(data.lengths, job.settings.eval_batch_size):
        batch = _to_device(fd.collate(data, rows, multiple), device)
        with autocast():
            scores = model(batch).float()
        if job.spec.kind == "regression":
            values = scores.reshape(-1).double().cpu().numpy()
        else:
            values = scores.argmax(-1).cpu().numpy().astype(np.int64)
        if out is None:
            out = np.zeros(len(data), dtype=values.dtype)
        out[rows] = values
    model.train()
    assert out is not None
    return out


def train_seed(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """Finetune a fresh copy of the model with `seed`; evaluate on every dev split.

    Returns {seed, metrics: {split: {...}}, predictions: {split: array}, first_epoch_loss,
    last_epoch_loss, steps, train_examples, train_seconds, eval_seconds, seconds (all, model loading
    included)}. A non-finite loss raises PipelineError.
    """
    s, spec = job.settings, job.spec
    device = torch.device(device)
    t0 = time.time()
    torch.manual_seed(training.step_seed(seed, -1))  # the new head's initial weights
    model = build_model(job).to(device)
    model.train()
    train = job.data["train"]
    lengths = train.lengths
    steps_per_epoch = math.ceil(len(train) / s.batch_size)
    total = steps_per_epoch * s.epochs
    groups = parameter_groups(model, s.lr, s.weight_decay, s.layer_lr_decay)
    for g in groups:
        g.pop("names")
    optimizer, schedule = training.optimizer_and_schedule(model, s.lr, s.weight_decay, s.warmup_ratio, total, groups)
    bf16 = training.mixed_precision(s.precision) == "bf16"
    # A GPU step of a base model on short batches is bound by the CPU launching ~1,200 small kernels
    # (measured on an H100: the GPU busy 0.97 s of a 4.91 s profiled RTE seed); compiling fuses most
    # of them. One graph serves every batch length (dynamic), so length-grouped batches do not recompile.
    forward = torch.compile(model, dynamic=True) if s.compile else model

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    where = f"finetune {job.kind} {Path(job.model_path).name} {spec.name} seed {seed}"
    multiple = pad_multiple(s, device)
    epoch_losses, step = [], 0
    t_train = time.time()
    for epoch in range(s.epochs):
        losses = []
        for rows in fd.length_grouped_batches(lengths, s.batch_size, seed, epoch, s.length_group):
            batch = _to_device(fd.collate(train, rows, multiple), device)
            torch.manual_seed(training.step_seed(seed, -2, step))  # dropout of this step
            with autocast():
                scores = forward(batch)
            loss = task_loss(spec, scores, batch["labels"])
            training.check_finite(loss.detach(), step, where)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            step += 1
        epoch_losses.append(float(torch.stack(losses).mean()))

    train_seconds = time.time() - t_train
    t_eval = time.time()
    metrics, predictions = {}, {}
    for split in job.dev_splits:
        data = job.data[split]
        pred = predict(forward, job, data, device, autocast)
        if len(pred) != len(data):
            raise PipelineError(f"{where}: {len(pred)} predictions for {len(data)} {split} examples")
        predictions[split] = pred
        metrics[split] = compute_metrics(spec.name, pred, data.labels)
    return {"seed": seed, "metrics": metrics, "predictions": predictions, "first_epoch_loss": epoch_losses[0],
            "last_epoch_loss": epoch_losses[-1], "steps": step, "train_examples": len(train) * s.epochs,
            "train_seconds": round(train_seconds, 3), "eval_seconds": round(time.time() - t_eval, 3),
            "seconds": round(time.time() - t0, 3)}


_worker_device = "cpu"  # set in each pool worker by `_init_worker`
_worker_jobs: list[Job] = []


def _init_worker(jobs: list[Job], devices, threads: int) -> None:
    """Pool worker start: take the jobs once (inherited under fork, pickled once under spawn), claim a device."""
    global _worker_device, _worker_jobs
    _worker_jobs, _worker_device = jobs, devices.get()
    if threads:
        torch.set_num_threads(threads)


def _train_in_worker(index: int, seed: int) -> dict:
    return train_or_resume(_worker_jobs[index], seed, _worker_device)


def train_or_resume(job: Job, seed: int, device: str | torch.device = "cpu") -> dict:
    """`train_seed`, or the result this job and seed already saved in `job.checkpoint_dir`.

    A paper-profile grid runs for days; a kill should cost the seeds in flight, not the finished ones.
    The saved result is tied to the job's identity, settings and seed, so changed inputs train afresh.
    """
    if not job.checkpoint_dir:
        return train_seed(job, seed, device)
    path = Path(job.checkpoint_dir) / f"seed_{seed}.pt"
    fingerprint = training.fingerprint(job.identity, dataclasses.asdict(job.settings), seed)
    state = training.load_checkpoint(path, fingerprint)
    if state is not None:
        return state["result"]
    result = train_seed(job, seed, device)
    training.save_checkpoint(path, {"result": result}, fingerprint)
    return result


def plan_workers(n_runs: int, workers: int | str) -> tuple[list[str], int]:
    """(device of each worker, torch threads per worker; 0 = leave torch's setting alone).

    GPUs: one worker per GPU (at most `workers` when it is a number). CPU: `workers` processes
    (auto = one per core, at most one per run), the cores split evenly between them; small models
    train faster as several one-thread processes than as one process with several threads.
    """
    n_gpus = torch.cuda.device_count()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n_gpus:
        n = n_gpus if workers == "auto" else min(int(workers), n_gpus)
    else:
        n = cores if workers == "auto" else int(workers)
    n = max(1, min(n, n_runs))
    devices = [f"cuda:{i}" for i in range(n)] if n_gpus else ["cpu"] * n
    return devices, (0 if n_gpus or n == 1 else max(1, cores // n))


def _cost(job: Job) -> tuple[int, int]:
    """Sort key, largest first: the full model costs several encoders, then the training tokens decide."""
    train = job.data["train"]
    size = sum(int(r.offsets[-1]) for r in train.inputs.values()) + (0 if train.clip_ids is None else train.clip_ids.size)
    return ({"full": 2, "clip": 1}.get(job.kind, 0), size)


def run_grid(work: list[tuple[Job, list[int]]], workers: int | str = 1) -> list[list[dict]]:
    """`train_or_resume` for every (job, seed) of `work`; per job, its results in seed order.

    All runs share one pool and a free worker takes the next run, longest first, so no worker waits
    while another still has several seeds of its share to go (a task's runs differ up to 5x in cost).
    """
    runs = [(i, seed) for i, (_, seeds) in enumerate(work) for seed in seeds]
    if any(not seeds for _, seeds in work):
        raise PipelineError("no seeds to run: `finetune.seeds` (and `finetune.rte_seeds` for RTE) must list at least one")
    jobs = [job for job, _ in work]
    devices, threads = plan_workers(len(runs), workers)
    if len(devices) == 1:
        done = {(i, seed): train_or_resume(jobs[i], seed, devices[0]) for i, seed in runs}
    else:
        # fork shares the tokenized data without copying; CUDA cannot be used after a fork, so GPUs spawn.
        context = multiprocessing.get_context("spawn" if devices[0].startswith("cuda") else "fork")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the parent's tokenizer is not used after the fork
        free_devices = context.Queue()
        for device in devices:
            free_devices.put(device)
        runs.sort(key=lambda run: _cost(jobs[run[0]]), reverse=True)
        with futures.ProcessPoolExecutor(len(devices), mp_context=context, initializer=_init_worker,
                                         initargs=(jobs, free_devices, threads)) as pool:
            pending = {run: pool.submit(_train_in_worker, *run) for run in runs}
            done = {run: f.result() for run, f in pending.items()}
    return [[done[(i, seed)] for seed in seeds] for i, (_, seeds) in enumerate(work)]


def run_seeds(job: Job, seeds: list[int], workers: int | str = 1) -> list[dict]:
    """`train_seed` for every seed of one job (see `run_grid`); results in seed order."""
    return run_grid([(job, list(seeds))], workers)[0]


# ----------------------------------------------------------------------------------------------------
# 5. Results
# ----------------------------------------------------------------------------------------------------

def _clean(x: float) -> float | None:
    """NaN (e.g. Spearman of a constant prediction) becomes null in JSON, not an invalid token."""
    return None if x is None or not math.isfinite(x) else float(x)


def summarize(job: Job, runs: list[dict]) -> dict:
    """Per-seed metrics and the median over seeds of every dev metric; headline = `median[first split][metric]`."""
    spec = job.spec
    median = {}
    for split in spec.dev_splits:
        names = runs[0]["metrics"][split].keys()
        median[split] = {m: _clean(float(np.median([r["metrics"][split][m] for r in runs]))) for m in names}
    per_seed = {str(r["seed"]): {
        **{split: {m: _clean(v) for m, v in r["metrics"][split].items()} for split in spec.dev_splits},
        **{k: _clean(r[k]) for k in ("first_epoch_loss", "last_epoch_loss")},
        **{k: r[k] for k in ("steps", "train_seconds", "eval_seconds", "seconds")}} for r in runs}
    return {
        "task": spec.name, "kind": job.kind, "metric": spec.metric, "higher_is_better": spec.higher_is_better,
        "headline": median[spec.dev_splits[0]][spec.metric], "median": median, "seeds": per_seed,
        "n_seeds": len(runs),
    }


def predictions_table(job: Job, runs: list[dict]) -> pa.Table:
    """One row per (seed, dev split, example): seed, split, idx, prediction, label, correct.

    `correct` is null for regression, where no single prediction is right or wrong.
    """
    regression = job.spec.kind == "regression"
    cols: dict[str, list] = {k: [] for k in ("seed", "split", "idx", "prediction", "label", "correct")}
    for r in runs:
        for split in job.dev_splits:
            data, pred = job.data[split], np.asarray(r["predictions"][split])
            if pred.shape != (len(data),):
                raise PipelineError(f"seed {r['seed']} {split}: {pred.shape[0] if pred.ndim else 0} predictions for {len(data)} examples")
            cols["seed"].append(np.full(len(data), r["seed"], dtype=np.int64))
            cols["split"].append(np.full(len(data), split, dtype=object))
            cols["idx"].append(data.idx)
            cols["prediction"].append(pred.astype(np.float64 if regression else np.int64))
            cols["label"].append(data.labels.astype(np.float64 if regression else np.int64))
            cols["correct"].append(np.full(len(data), None, dtype=object) if regression else pred == data.labels)
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    schema = pa.schema([("seed", pa.int64()), ("split", pa.string()), ("idx", pa.int64()),
                        ("prediction", pa.float64() if regression else pa.int64()),
                        ("label", pa.float64() if regression else pa.int64()), ("correct", pa.bool_())])
    return pa.table({k: pa.array(arrays[k], type=schema.field(k).type) for k in schema.names}, schema=schema)


def write_results(out_dir: str | Path, job: Job, runs: list[dict], info: dict[str, Any]) -> dict:
    """Write metrics.json and predictions.parquet into `out_dir`, as one atomic directory."""
    table = predictions_table(job, runs)  # checks the prediction lengths before anything is written
    metrics = {**info, **summarize(job, runs),
               "hyperparameters": {**dataclasses.asdict(job.settings),
                                   "precision": training.mixed_precision(job.settings.precision),
                                   "model_size": size_of(job.width)}}
    with io.atomic_path(out_dir, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        io.write_json(tmp / "metrics.json", metrics)
        pq.write_table(table, tmp / "predictions.parquet")
    return metrics
