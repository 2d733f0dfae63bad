"""Stage `attention`: paper Table 9 (cross-attention maps) and a per-head alignment table.

    params: attention.{variants, task, index, max_len, clip_blocks_per_sentence, windows, batch_size}
    deps:   models/crossmodal/<variant>, models/tokenizer, data/tasks, data/shards
    outs:   reports/attention/ (PNGs), reports/attention.md, results/attention.json

Heatmaps: one dev example (`task`, `index` = its idx) through each full cross-modal model, language
tokens x CLIP tokens for every cross layer, head 0 (as in the paper) and the mean over heads. The
pair is laid out as in finetuning: [CLS] a [SEP] b [SEP] for the encoder, each sentence in its own
`clip_blocks_per_sentence` CLIP blocks.
Alignment: the first `windows` valid windows of data/shards; for every layer and head the share of
language tokens whose most-attended CLIP token covers the same characters, beside a chance and a
diagonal baseline (definitions in xdbert/analysis/attention.py).
"""
from __future__ import annotations

from pathlib import Path


from xdbert import io
from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.stage import run

TASKS_DIR, TOKENIZER, SHARDS, OUT = "data/tasks", "models/tokenizer", "data/shards", Path("reports/attention")


def read_params() -> tuple[dict, dict]:
    p = P.load()
    s = P.section(p, "attention")
    variants = P.get(s, "variants", "attention")
    if not isinstance(variants, list) or not variants or len(set(variants)) != len(variants):
        raise PipelineError(f"`attention.variants` must be a non-empty list of adapt variants without repeats; got {variants!r}")
    for v in variants:
        if not (Path("models/crossmodal") / str(v) / "xdbert_config.json").is_file():
            raise PipelineError(f"missing models/crossmodal/{v}: run its adapt stage first (`dvc repro adapt@{v}`), or "
                                f"remove `{v}` from `attention.variants`")
    from xdbert.tasks.registry import get_task

    if get_task(P.get(s, "task", "attention")).kind == "multiple_choice":
        raise PipelineError("`attention.task` must be a sentence or sentence-pair task, not multiple choice (e.g. rte)")
    if not isinstance(s.get("index"), int) or isinstance(s.get("index"), bool):
        raise PipelineError(f"`attention.index` must be the integer idx of a dev example; got {s.get('index')!r}")
    for key in ("max_len", "clip_blocks_per_sentence", "windows", "batch_size"):
        P.positive(P.get(s, key, "attention"), f"attention.{key}")
    return p, s


def main() -> None:
    p, s = read_params()
    import numpy as np
    import torch

    from xdbert import finetune_data as fd
    from xdbert import shards, tokenization
    from xdbert.analysis import attention as A
    from xdbert.clip import clip_block_mask, clip_tokenizer
    from xdbert.modeling import load_full
    from xdbert.reports import header
    from xdbert.tasks.registry import get_task, read_split

    spec = get_task(s["task"])
    split = spec.dev_splits[0]
    table = read_split(TASKS_DIR, s["task"], split)
    where = np.flatnonzero(table.column("idx").to_numpy() == s["index"])
    if where.size == 0:
        ids = table.column("idx").to_numpy()
        raise PipelineError(f"`attention.index: {s['index']}` is no idx of {s['task']} {split} (idx runs {ids.min()}..{ids.max()})")
    example = table.slice(int(where[0]), 1)
    tokenizer = tokenization.load_encoder_tokenizer(TOKENIZER)
    valid = shards.open_shards(SHARDS, "valid")
    n_windows = min(int(s["windows"]), len(valid))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    results, pictures = {}, {}
    with io.atomic_path(OUT, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for variant in s["variants"]:
            model = load_full(Path("models/crossmodal") / variant, device).eval()
            cfg = model.config
            if cfg.placeholder:
                raise PipelineError(f"variant `{variant}` replaces CLIP by a placeholder: it has no CLIP tokens to attend to")
            shards.check_matches(valid.manifest, TOKENIZER, cfg.clip)

            # --- the example's maps (Table 9)
            to_blocks, eot = fd.clip_block_encoder(cfg.clip)
            enc = fd.encode_bert(tokenizer, spec, example, int(s["max_len"]))
            enc.clip_ids = fd.encode_clip(to_blocks, spec, example, int(s["clip_blocks_per_sentence"]))
            batch = {k: torch.as_tensor(v).to(device) for k, v in fd.collate(enc, np.array([0])).items() if k != "labels"}
            attentions = A.language_cross_attentions(model, batch["input_ids"], batch["attention_mask"], batch["clip_ids"])
            keys = clip_block_mask(batch["clip_ids"], eot).reshape(-1).cpu().numpy()
            rows = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
            cols = A.clip_token_labels(batch["clip_ids"].reshape(-1).cpu().numpy()[keys].tolist(), clip_tokenizer(cfg.clip))
            pictures[variant] = A.example_heatmaps(attentions, keys, rows, cols, tmp, variant)

            # --- alignment over shard windows
            stats = A.alignment_over_windows(model, valid, n_windows, int(s["batch_size"]), cfg.clip_eot_id)
            results[variant] = stats.table()
            print(f"attention {variant}: best head per layer " + ", ".join(
                f"{100 * max(r):.1f}%" for r in results[variant]["accuracy"]) +
                f" (chance {100 * results[variant]['chance']:.1f}%, diagonal {100 * results[variant]['diagonal']:.1f}%)")

    io.write_json("results/attention.json", {"profile": p["profile"], "example": {"task": s["task"], "idx": s["index"]},
                                             "variants": results})
    io.write_text("reports/attention.md", report(p, s, results, pictures, header))


def report(p: dict, s: dict, results: dict, pictures: dict, header) -> str:
    from xdbert.analysis.attention import markdown_table

    variants = list(results)
    md = [header("Table 9: cross-attention maps and per-head alignment", p["profile"], ", ".join(f"`{v}`" for v in variants), "-"),
          f"## Maps: {s['task'].upper()} dev example idx {s['index']}", "",
          "Rows: language tokens (queries of the cross layers' language stream); columns: CLIP-T tokens (keys), padding "
          "left out. The paper shows head 0 of both layers for the model with and without CLIPTC.", "",
          "| " + " | ".join(f"`{v}`" for v in variants) + " |", "|---" * len(variants) + "|"]
    for i in range(len(pictures[variants[0]])):
        cells = []
        for v in variants:
            layer, head, name = pictures[v][i]
            what = "head 0" if head == "head0" else "mean over heads"
            cells.append(f"layer {layer}, {what}<br>![{v} layer {layer} {what}](attention/{name})")
        md.append("| " + " | ".join(cells) + " |")
    md += ["", "## Alignment accuracy per layer and head", "",
           "Each head is read as a pointer (Li et al., 2020, seed 002): a language token is counted right when its "
           "most-attended CLIP token covers the same characters of the text (`align_start`/`align_end` in the shards). "
           "Counted: real, non-special BERT tokens with a non-empty aligned CLIP range; argmax over valid CLIP positions "
           "(start/end tokens included, padding never). Cells: accuracy % (mean attention mass % inside the aligned "
           "range). Baselines: *chance* = expected accuracy of an argmax drawn uniformly among the valid CLIP positions; "
           "*diagonal* = always pointing at the same relative position (rank r of L BERT tokens -> rank "
           "floor((r + 0.5) C / L) of C CLIP tokens).", ""]
    for v in variants:
        md += [markdown_table(results[v], f"`{v}`"), ""]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    run(main)
