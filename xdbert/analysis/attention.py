"""Cross-attention from language tokens to CLIP tokens: heatmaps (paper Table 9) and per-head alignment.

Table 9 of the paper shows, for one RTE pair, the attention of the cross layers' language stream over
CLIP-T's tokens (head 0 of layers 1 and 2), adapted with and without CLIPTC, to argue that CLIPTC
keeps the cross-attention diverse instead of collapsing onto a few common tokens.

The quantitative part follows "What does BERT with vision look at?" (Li et al., 2020), which treats
every attention head as a classifier that points each word at its most-attended region. Here the
"region" of a BERT token is known exactly: the CLIP tokens that cover the same characters of the
same text (the shards' `align_start`/`align_end`). For every layer and head:

  alignment accuracy = share of language tokens whose argmax over CLIP positions falls inside the
                       token's aligned CLIP range [start, end).

Counted tokens: real (non-padding) BERT positions that are not special tokens and have a non-empty
aligned range. The argmax runs over valid CLIP positions only (the real tokens of used blocks, the
start/end tokens included; never padding). Two head-independent baselines stand beside it:

  chance:   the expected accuracy of an argmax drawn uniformly among the valid CLIP positions, i.e.
            the mean over counted tokens of (end - start) / (number of valid CLIP positions);
  diagonal: the accuracy of always pointing at the same RELATIVE position: the token of rank r among
            the L real BERT positions points at the valid CLIP position of rank floor((r + 0.5) * C / L)
            among C, the text-order analogue of the rule-based baseline of Li et al. (2020), "What Does
            BERT with Vision Look At?".

Also reported: the mean attention MASS inside the aligned range (a soft version of the accuracy).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from xdbert import params as P
from xdbert.adaptation.settings import AdaptSettings
from xdbert.data.tasks.registry import TASK_NAMES, get_task
from xdbert.errors import PipelineError
from xdbert.model.files import CROSSMODAL_CONFIG
from xdbert.model.families import ablation_family
from xdbert.paths import crossmodal

CLIP_SPECIAL_LABELS = {"<start_of_text>": "<sot>", "<end_of_text>": "<eot>"}


# ----------------------------------------------------------------------------------------------------
# The `attention` params
# ----------------------------------------------------------------------------------------------------

ATTENTION_KEYS = ("variants", "task", "index", "max_len", "clip_blocks_per_sentence", "windows", "batch_size")  # a typo: refused

@dataclass(frozen=True)
class AttentionSettings:
    """The `attention` params section, checked, with every variant's cross-modal model present."""

    variants: tuple[str, ...]
    family: str               # `adapt.family`, whose variants these are
    task: str
    index: int
    max_len: int
    clip_blocks_per_sentence: int
    windows: int
    batch_size: int

    @classmethod
    def from_params(cls, params: dict, files: bool = True) -> "AttentionSettings":
        """`files`: also check that every variant's cross-modal model is saved (False: the values only, as
        `xdbert check`)."""
        sec = P.section(params, "attention", ATTENTION_KEYS)
        get = P.getter(sec, "attention")

        variants = get("variants")
        if not isinstance(variants, list) or not variants or not all(isinstance(v, str) and v for v in variants) \
                or len(set(variants)) != len(variants):
            raise PipelineError(f"`attention.variants` must be a non-empty list of adapt variants without repeats; got {variants!r}")
        family = ablation_family(params).name  # the variants are Table 3's, adapted on `adapt.family`
        # the adaptations with CLIP text to attend to: baseline has no cross-modal model, a placeholder no CLIP,
        # a variant without cross layers (the caption control) no cross-attention
        runs = {v: AdaptSettings.from_params(params, v) for v in (P.PROPOSED, *P.variant_names(params))}
        adapted = [v for v, a in runs.items() if a.cross_layers and not a.placeholder]
        for v in variants:
            if v not in adapted:
                raise PipelineError(f"`attention.variants` names {v!r}, which is not an adapt variant with CLIP text "
                                    f"(baseline has no cross-modal model, a placeholder no CLIP, a variant with "
                                    f"`cross_layers: 0` no cross-attention); allowed: {', '.join(adapted)}")
        task = P.choice(get("task"), "attention.task", TASK_NAMES)
        if get_task(task).kind == "multiple_choice":
            raise PipelineError("`attention.task` must be a sentence or sentence-pair task, not multiple choice (e.g. rte)")
        index = get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise PipelineError(f"`attention.index` must be the integer idx of a dev example; got {index!r}")
        sizes = {key: P.positive(get(key), f"attention.{key}")
                 for key in ("max_len", "clip_blocks_per_sentence", "windows", "batch_size")}
        settings = cls(tuple(variants), family, task, index, **sizes)
        if files:
            settings.check_files()
        return settings

    def check_files(self) -> None:
        """Every variant's cross-modal model is saved."""
        for v in self.variants:
            saved = crossmodal(self.family, v) / CROSSMODAL_CONFIG
            if not saved.is_file():
                stage = f"adapt@{self.family}" if v == P.PROPOSED else f"ablate@{v}"
                raise PipelineError(f"missing {saved}: run its adapt stage first (`dvc repro {stage}`), or "
                                    f"remove `{v}` from `attention.variants`")


def dev_example(table: pa.Table, index: int, task: str, split: str) -> pa.Table:
    """The one row of a dev split whose idx is `index`."""
    ids = table.column("idx").to_numpy()
    where = np.flatnonzero(ids == index)
    if where.size == 0:
        raise PipelineError(f"`attention.index: {index}` is no idx of {task} {split} (idx runs {ids.min()}..{ids.max()})")
    return table.slice(int(where[0]), 1)


# ----------------------------------------------------------------------------------------------------
# Alignment accuracy
# ----------------------------------------------------------------------------------------------------

def counted_queries(align_start: np.ndarray, align_end: np.ndarray, query_mask: np.ndarray) -> np.ndarray:
    """(B, L) bool: the language tokens that take part (real, not special, non-empty aligned range)."""
    return np.asarray(query_mask, bool) & (align_start >= 0) & (align_end > align_start)


def argmax_hits(attn: np.ndarray, align_start: np.ndarray, align_end: np.ndarray, query_mask: np.ndarray,
                key_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per head: (argmax hits (H,), attention mass inside the range summed over tokens (H,), tokens counted).

    Args:
      attn: (B, H, L, C) attention probabilities of language queries over flat CLIP positions.
      align_start, align_end: (B, L) flat CLIP range [start, end) of every BERT position, -1 for specials.
      query_mask: (B, L) real BERT positions. key_mask: (B, C) valid CLIP positions.
    """
    attn = np.asarray(attn)
    if not np.issubdtype(attn.dtype, np.floating):
        attn = attn.astype(np.float64)
    b, h, l, c = attn.shape
    start, end = np.asarray(align_start, np.int64), np.asarray(align_end, np.int64)
    counted = counted_queries(start, end, query_mask)
    if (end[counted] > c).any():
        raise ValueError(f"an aligned CLIP range ends after the {c} CLIP positions")
    keys = np.asarray(key_mask, bool)[:, None, None, :]
    top = np.where(keys, attn, -np.inf).argmax(axis=-1)                       # (B, H, L)
    hit = (top >= start[:, None, :]) & (top < end[:, None, :]) & counted[:, None, :]
    # Mass inside [start, end) from a prefix sum; in the input's precision (float32 for paper-sized windows).
    cum = np.concatenate([np.zeros((b, h, l, 1), dtype=attn.dtype), np.cumsum(attn, axis=-1)], axis=-1)
    s = np.clip(start, 0, c)[:, None, :, None]
    e = np.clip(end, 0, c)[:, None, :, None]
    mass = (np.take_along_axis(cum, e, -1) - np.take_along_axis(cum, s, -1))[..., 0] * counted[:, None, :]
    return hit.sum(axis=(0, 2)).astype(np.int64), mass.sum(axis=(0, 2), dtype=np.float64), int(counted.sum())


def chance_hits(align_start: np.ndarray, align_end: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> float:
    """Expected hits of an argmax drawn uniformly among each window's valid CLIP positions."""
    counted = counted_queries(align_start, align_end, query_mask)
    n_keys = np.asarray(key_mask, bool).sum(axis=1, keepdims=True).astype(np.float64)
    width = (np.asarray(align_end) - np.asarray(align_start)).astype(np.float64)
    return float(np.sum(np.where(counted, width / np.maximum(n_keys, 1.0), 0.0)))


def diagonal_targets(query_mask: np.ndarray, key_mask: np.ndarray) -> np.ndarray:
    """(B, L) the flat CLIP position at the same relative position as each real BERT position (-1 elsewhere)."""
    query_mask, key_mask = np.asarray(query_mask, bool), np.asarray(key_mask, bool)
    out = np.full(query_mask.shape, -1, dtype=np.int64)
    for i in range(query_mask.shape[0]):
        queries, keys = np.flatnonzero(query_mask[i]), np.flatnonzero(key_mask[i])
        if len(queries) == 0 or len(keys) == 0:
            continue
        rank = np.floor((np.arange(len(queries)) + 0.5) * len(keys) / len(queries)).astype(np.int64)
        out[i, queries] = keys[np.minimum(rank, len(keys) - 1)]
    return out


def diagonal_hits(align_start: np.ndarray, align_end: np.ndarray, query_mask: np.ndarray, key_mask: np.ndarray) -> int:
    """Hits of the relative-position (diagonal) baseline."""
    counted = counted_queries(align_start, align_end, query_mask)
    target = diagonal_targets(query_mask, key_mask)
    return int(np.sum(counted & (target >= align_start) & (target < align_end)))


@dataclass
class AlignmentStats:
    """Running totals over batches for every cross layer; `table()` gives the per-head shares."""

    layers: int
    heads: int
    hits: np.ndarray = field(init=False)
    mass: np.ndarray = field(init=False)
    tokens: int = 0
    chance: float = 0.0
    diagonal: int = 0
    windows: int = 0

    def __post_init__(self) -> None:
        self.hits = np.zeros((self.layers, self.heads), dtype=np.int64)
        self.mass = np.zeros((self.layers, self.heads), dtype=np.float64)

    def add(self, attentions: Sequence[np.ndarray], align_start: np.ndarray, align_end: np.ndarray,
            query_mask: np.ndarray, key_mask: np.ndarray) -> None:
        """One batch: `attentions[layer]` is (B, H, L, C); the rest as in `argmax_hits`."""
        if len(attentions) != self.layers:
            raise ValueError(f"expected {self.layers} layers of attention, got {len(attentions)}")
        tokens = None
        for layer, attn in enumerate(attentions):
            hits, mass, n = argmax_hits(attn, align_start, align_end, query_mask, key_mask)
            self.hits[layer] += hits
            self.mass[layer] += mass
            tokens = n
        self.tokens += int(tokens or 0)
        self.chance += chance_hits(align_start, align_end, query_mask, key_mask)
        self.diagonal += diagonal_hits(align_start, align_end, query_mask, key_mask)
        self.windows += int(np.asarray(query_mask).shape[0])

    def table(self) -> dict:
        """Shares (0-1): accuracy[layer][head], mass[layer][head], and the two baselines."""
        n = max(self.tokens, 1)
        return {
            "tokens": self.tokens,
            "windows": self.windows,
            "best_per_layer": {f"layer{i + 1}": float(a.max()) for i, a in enumerate(self.hits / n)},
            "accuracy": (self.hits / n).tolist(),
            "mass": (self.mass / n).tolist(),
            "chance": self.chance / n,
            "diagonal": self.diagonal / n,
        }


def markdown_table(stats: dict, name: str) -> str:
    """Rows = cross layers, columns = heads (argmax accuracy %, with the mean attention mass %)."""
    acc, mass = np.asarray(stats["accuracy"]), np.asarray(stats["mass"])
    heads = acc.shape[1]
    lines = [f"**{name}** — {stats['tokens']} language tokens in {stats['windows']} windows; "
             f"baselines: chance {100 * stats['chance']:.1f}%, diagonal {100 * stats['diagonal']:.1f}%", "",
             "| layer | " + " | ".join(f"head {h}" for h in range(heads)) + " | best | mean |",
             "|---" * (heads + 3) + "|"]
    for layer in range(acc.shape[0]):
        cells = [f"{100 * acc[layer, h]:.1f} <sub>({100 * mass[layer, h]:.1f})</sub>" for h in range(heads)]
        lines.append(f"| {layer + 1} | " + " | ".join(cells) + f" | {100 * acc[layer].max():.1f} | {100 * acc[layer].mean():.1f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# Heatmaps
# ----------------------------------------------------------------------------------------------------

def clip_token_labels(ids: Sequence[int], tokenizer) -> list[str]:
    """Readable labels of CLIP BPE ids with an open_clip SimpleTokenizer (`</w>` dropped, specials short)."""
    out = []
    for i in ids:
        raw = tokenizer.decoder.get(int(i), "?")
        text = CLIP_SPECIAL_LABELS.get(raw) or tokenizer.decode([int(i)]).strip() or raw
        out.append(text)
    return out


def plot_heatmap(matrix: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], title: str,
                 path: str | Path) -> Path:
    """Language tokens (rows) x CLIP tokens (columns) attention as a PNG with every token as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = np.asarray(matrix, dtype=np.float64)
    rows, cols = matrix.shape
    if (rows, cols) != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix {matrix.shape} does not match {len(row_labels)} x {len(col_labels)} labels")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.16 * cols), max(4.0, 1.2 + 0.16 * rows)))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0)
    ax.set_xticks(range(cols), labels=list(col_labels), rotation=90, fontsize=6)
    ax.set_yticks(range(rows), labels=list(row_labels), fontsize=6)
    ax.set_xlabel("CLIP-T tokens")
    ax.set_ylabel("language tokens")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------
# Running a cross-modal model (torch is imported here only)
# ----------------------------------------------------------------------------------------------------

def language_cross_attentions(model, bert_ids, bert_mask, clip_ids) -> list[np.ndarray]:
    """Per cross layer, the language stream's attention over CLIP positions: (B, H, L, n_blocks*77) float32.

    `model` is an `XDBertModel` (eval mode is the caller's job); inputs are tensors on its device,
    clip_ids shaped (B, n_blocks, 77).
    """
    import torch

    with torch.no_grad():
        out = model(bert_ids=bert_ids, bert_mask=bert_mask, clip_ids=clip_ids, output_attentions=True)
    return [layer["language"].float().cpu().numpy() for layer in out["cross_attentions"]]


def alignment_over_windows(model, windows, n_windows: int, batch_size: int, eot_id: int) -> AlignmentStats:
    """Alignment statistics of `model` over the first `n_windows` token windows, `batch_size` at a time.

    `windows[index_array]` returns a dict of arrays like the shards' rows: bert_ids (B, L), bert_mask
    (B, L), clip_ids (B, n_blocks*77), align_start / align_end (B, L).
    """
    import torch

    from xdbert.clip import clip_block_mask

    device = next(model.parameters()).device
    stats = AlignmentStats(layers=len(model.cross_layers), heads=model.encoder.config.num_attention_heads)
    for start in range(0, n_windows, batch_size):
        w = windows[np.arange(start, min(n_windows, start + batch_size))]
        b = len(w["bert_ids"])
        bert_ids = torch.as_tensor(np.asarray(w["bert_ids"], dtype=np.int64), device=device)
        bert_mask = torch.as_tensor(np.asarray(w["bert_mask"], dtype=np.int64), device=device)
        clip_ids = torch.as_tensor(np.asarray(w["clip_ids"], dtype=np.int64), device=device).reshape(b, -1, model.context_length)
        key_mask = clip_block_mask(clip_ids, eot_id).reshape(b, -1).cpu().numpy()
        stats.add(language_cross_attentions(model, bert_ids, bert_mask, clip_ids), np.asarray(w["align_start"], np.int64),
                  np.asarray(w["align_end"], np.int64), np.asarray(w["bert_mask"]).astype(bool), key_mask)
    return stats


def example_heatmaps(attentions: Sequence[np.ndarray], key_mask: np.ndarray, row_labels: Sequence[str],
                     col_labels: Sequence[str], out_dir: str | Path, prefix: str) -> list[tuple[int, str, str]]:
    """Table 9's pictures for ONE example: per cross layer, head 0 and the mean over heads.

    attentions[layer]: (1, H, L, C); key_mask (C,) marks the valid CLIP positions kept as columns
    (`col_labels` label those). Returns (layer, "head0" | "mean", file name) per picture written.
    """
    keys = np.asarray(key_mask, bool)
    out = []
    for layer, attn in enumerate(attentions, start=1):
        lang = np.asarray(attn)[0][:, :, keys]
        for kind, matrix, what in (("head0", lang[0], "head 0"), ("mean", lang.mean(axis=0), f"mean of {lang.shape[0]} heads")):
            name = f"{prefix}_layer{layer}_{kind}.png"
            plot_heatmap(matrix, row_labels, col_labels, f"{prefix}: cross layer {layer}, {what}", Path(out_dir) / name)
            out.append((layer, kind, name))
    return out


# ----------------------------------------------------------------------------------------------------
# The report (paper Table 9 and the alignment tables)
# ----------------------------------------------------------------------------------------------------

def table9_markdown(head: str, task: str, index: int, results: dict, pictures: dict) -> str:
    """reports/attention.md: `head`, the heatmaps of every variant side by side, then the alignment tables."""
    variants = list(results)
    md = [head,
          f"## Maps: {task.upper()} dev example idx {index}", "",
          "Rows: language tokens (queries of the cross layers' language stream); columns: CLIP-T tokens (keys), padding "
          "left out. The paper shows head 0 of both layers for the model with and without CLIPTC.", "",
          "| " + " | ".join(f"`{v}`" for v in variants) + " |", "|---" * len(variants) + "|"]
    for i in range(len(pictures[variants[0]])):
        cells = []
        for v in variants:
            layer, head_kind, name = pictures[v][i]
            what = "head 0" if head_kind == "head0" else "mean over heads"
            cells.append(f"layer {layer}, {what}<br>![{v} layer {layer} {what}](attention/{name})")
        md.append("| " + " | ".join(cells) + " |")
    md += ["", "## Alignment accuracy per layer and head", "",
           "Each head is read as a pointer, as Li et al. (2020) read VisualBERT's (*What Does BERT with Vision Look "
           "At?*): a language token is counted right when its "
           "most-attended CLIP token covers the same characters of the text (`align_start`/`align_end` in the shards). "
           "Counted: real, non-special BERT tokens with a non-empty aligned CLIP range; argmax over valid CLIP positions "
           "(start/end tokens included, padding never). Cells: accuracy % (mean attention mass % inside the aligned "
           "range). Baselines: *chance* = expected accuracy of an argmax drawn uniformly among the valid CLIP positions; "
           "*diagonal* = always pointing at the same relative position (rank r of L BERT tokens -> rank "
           "floor((r + 0.5) C / L) of C CLIP tokens).", ""]
    for v in variants:
        md += [markdown_table(results[v], f"`{v}`"), ""]
    return "\n".join(md) + "\n"
