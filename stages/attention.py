"""Stage `attention`: paper Table 9 (cross-attention maps) and a per-head alignment table.

    deps:   models/crossmodal/<adapt.family>/<variant>, models/tokenizer, data/tasks, data/shards
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

from xdbert import io
from xdbert import params as P
from xdbert.analysis import attention as A
from xdbert.paths import ATTENTION, ATTENTION_METRICS, SHARDS, TASKS, TOKENIZER, crossmodal, report
from xdbert.stage import run


def read(p: dict) -> tuple[str, A.AttentionSettings]:
    """(profile, settings): every param this stage reads, checked; tools/dvc_yaml.py records them for its
    `params:` in dvc.yaml."""
    return p["profile"], A.AttentionSettings.from_params(p, files=False)


def main() -> None:
    profile, s = read(P.load())
    s.check_files()
    import numpy as np
    import torch

    from xdbert.clip import clip_block_mask, clip_tokenizer
    from xdbert.data import shards
    from xdbert.data.tasks.registry import get_task, read_split
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.finetuning.compute import data as fd
    from xdbert.model.saving import load_full
    from xdbert.reports.header import header

    spec = get_task(s.task)
    split = spec.dev_splits[0]
    example = A.dev_example(read_split(TASKS, s.task, split), s.index, s.task, split)
    tokenizer = load_encoder_tokenizer(TOKENIZER)
    valid = shards.open_shards(SHARDS, "valid", verify=True)
    n_windows = min(s.windows, len(valid))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    results, pictures = {}, {}
    with io.atomic_path(ATTENTION, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        for variant in s.variants:
            model = load_full(crossmodal(s.family, variant), device).eval()
            cfg = model.config
            shards.check_matches(valid.manifest, TOKENIZER, cfg.clip)
            fd.check_positions("attention.max_len", s.max_len, model.encoder.config, crossmodal(s.family, variant))

            # --- the example's maps (Table 9)
            to_blocks, eot = fd.clip_block_encoder(cfg.clip)
            enc = fd.encode_bert(tokenizer, spec, example, s.max_len)
            enc.clip_ids = fd.encode_clip(to_blocks, spec, example, s.clip_blocks_per_sentence)
            batch = {k: torch.as_tensor(v).to(device) for k, v in fd.collate(enc, np.array([0])).items() if k != "labels"}
            attentions = A.language_cross_attentions(model, batch["input_ids"], batch["attention_mask"], batch["clip_ids"])
            keys = clip_block_mask(batch["clip_ids"], eot).reshape(-1).cpu().numpy()
            rows = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
            cols = A.clip_token_labels(batch["clip_ids"].reshape(-1).cpu().numpy()[keys].tolist(), clip_tokenizer(cfg.clip))
            pictures[variant] = A.example_heatmaps(attentions, keys, rows, cols, tmp, variant)

            # --- alignment over shard windows
            stats = A.alignment_over_windows(model, valid, n_windows, s.batch_size, cfg.clip_eot_id)
            results[variant] = stats.table()
            print(f"attention {variant}: best head per layer " + ", ".join(
                f"{100 * max(r):.1f}%" for r in results[variant]["accuracy"]) +
                f" (chance {100 * results[variant]['chance']:.1f}%, diagonal {100 * results[variant]['diagonal']:.1f}%)")

    io.write_json(ATTENTION_METRICS, {"profile": profile, "example": {"task": s.task, "idx": s.index},
                                      "variants": results})
    head = header("Table 9: cross-attention maps and per-head alignment", profile, ", ".join(f"`{v}`" for v in results), "-")
    io.write_text(report("attention"), A.table9_markdown(head, s.task, s.index, results, pictures))


if __name__ == "__main__":
    run(main)
