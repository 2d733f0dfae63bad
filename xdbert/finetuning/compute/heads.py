"""The models finetuning trains: three kinds behind one interface, `forward(batch) -> scores (B, outputs)`.

- `encoder`: a `save_pretrained` folder (BERT, ELECTRA, the adapted XDBERT) with its family's own
  transformers head: `AutoModelForSequenceClassification` (problem_type regression for STS-B and
  READ) or `AutoModelForMultipleChoice` (SWAG), see `EncoderClassifier`.
- `clip`: CLIP's text tower alone (Table 1's CLIP-T row), see `ClipTowerClassifier`.
- `full`: the whole cross-modal model (Table 8), see `FullModelClassifier`.

`RowSubsetEmbedding` keeps only the CLIP token rows a task's text uses.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdbert.data.tasks.registry import TaskSpec
from xdbert.errors import PipelineError
from xdbert.hub import quiet_loading


def mask_always_applied():
    """A context in which transformers applies every batch's attention mask (the same scores). Eagerly it
    drops a mask that holds no padding, after reading its values on the host, which a vmapped call cannot
    (`stacked`). While a step is recorded as a CUDA graph it skips that read and applies the mask, so the
    step's eager first run would take other attention kernels than its recording (`graphed`)."""
    from transformers import masking_utils

    return mock.patch.object(masking_utils, "_ignore_bidirectional_mask_sdpa", _never_ignored)


def _never_ignored(*args, **kwargs) -> bool:  # one object: torch.compile may guard on the function's identity
    return False


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
        cls = encoder_head_class(path, spec)
        kwargs = {} if spec.kind == "multiple_choice" else {
            "num_labels": outputs_of(spec),
            "problem_type": "regression" if spec.kind == "regression" else "single_label_classification"}
        try:
            with quiet_loading():  # "newly initialized: classifier" is the point of finetuning
                self.model = cls.from_pretrained(path, **kwargs)
        except (OSError, ValueError) as e:
            raise PipelineError(f"cannot load encoder folder {path} ({e}); it must be a save_pretrained folder") from e
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
        xd.strip_heads()
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
        language, _ = self.xd.encode(ids, mask, _flat(batch["clip_ids"], 2), token_type_ids=types, language_cls_only=True,
                                     clip_layout=batch.get("clip_layout"))
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
        x = self.tower(ids, mask, batch.get("clip_layout")).reshape(n, n_blocks, context, -1)
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


class RowSubsetEmbedding(nn.Module):
    """The rows `ids` of embedding table `full`, looked up by their original ids.

    A finetuning run reads only the CLIP tokens of its task's text, a few thousand of CLIP's 49,408. The
    other rows cannot change any output, yet the optimizer, gradient clipping and the dense embedding
    gradient touch every row at every step: in the embedded profile the table is 84% of the full
    model's parameters. Keeping only the rows the
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
