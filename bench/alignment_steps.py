"""How many optimizer steps the cross layers need to line up two towers that start unaligned.

MATCH and copying across the towers both need the cross-attention to find, for a language token, the
CLIP token that says the same thing. Nothing in the initial weights does that: the cross layers are
random and, in the embedded profile, so is the CLIP tower. This measures how long learning it takes on
the easiest possible data, so the adapt stage's MATCH accuracy can be read against it.

Data: `--words` words, each one BERT id and one CLIP id; a window is `--length` random words, the
same on both sides ([CLS] w1..wn [SEP] and [SOT] w1..wn [EOT], so even positions line up). Model:
`XDBertModel` with params.yaml's encoder config, CLIP tower and cross layers, losses MLM + MATCH
(BERT's masking; half the windows get another window's CLIP text). AdamW at `--lr`, batch `--batch`.

Reported: the MLM loss and MATCH accuracy over training (means over `--every` steps), the first
step at which MLM falls below ln(words)/4 (copying from the CLIP side: without it the loss stays near
ln(words) - 1) and at which MATCH accuracy exceeds 0.6, and the seconds per step.

    python bench/alignment_steps.py [--steps 6000] [--words 20] [--length 8] [--lr 1e-3] [--batch 32]

Writes bench/results/alignment_steps.md and .json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from xdbert import io, masking, modeling, params  # noqa: E402

CLS, SEP, MASK, FIRST_WORD = 2, 3, 4, 10      # BERT ids; ids below FIRST_WORD are special
SOT, EOT, FIRST_CLIP = 49406, 49407, 1000     # CLIP ids; word w is FIRST_CLIP + 7 * w


def windows(words: int, length: int, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(bert_ids (B, length + 2), clip_ids (B, 1, 77)) of the same random words."""
    w = torch.randint(words, (batch, length), generator=gen)
    bert = torch.cat([torch.full((batch, 1), CLS), FIRST_WORD + w, torch.full((batch, 1), SEP)], dim=1)
    clip = torch.zeros(batch, 1, 77, dtype=torch.long)
    clip[:, 0, 0], clip[:, 0, length + 1] = SOT, EOT
    clip[:, 0, 1:length + 1] = FIRST_CLIP + 7 * w
    return bert, clip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--words", type=int, default=20)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    p = params.load(ROOT / "params.yaml")
    m, a = p["model"], p["adapt"]
    config = modeling.XDBertConfig(
        encoder=m["encoder"], encoder_config=m.get("encoder_config") or {}, vocab_size=FIRST_WORD + args.words,
        clip=m["clip"], clip_heads=a["clip_heads"], clip_blocks=1, cross_layers=a["cross_layers"], losses=["mlm", "match"])
    model = modeling.XDBertModel.build(config)
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)

    curve, window, t0 = [], [], time.time()
    for step in range(args.steps):
        bert, clip = windows(args.words, args.length, args.batch, gen)
        clip, match_labels = masking.choose_match_negatives(clip, gen, 0.5)
        inputs, mlm_labels = masking.mask_for_mlm(bert, torch.ones_like(bert), vocab_size=FIRST_WORD + args.words,
                                                  special_ids=range(FIRST_WORD), mask_id=MASK, generator=gen)
        out = model(inputs, torch.ones_like(bert), clip, mlm_labels=mlm_labels, match_labels=match_labels)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
        window.append((out["mlm_loss"].item(), out["match_correct"].item() / args.batch))
        if len(window) == args.every:
            curve.append({"step": step + 1, "mlm_loss": sum(x for x, _ in window) / len(window),
                          "match_accuracy": sum(y for _, y in window) / len(window)})
            window = []
            print(json.dumps(curve[-1]), flush=True)
    seconds = time.time() - t0

    copy_at = next((c["step"] for c in curve if c["mlm_loss"] < math.log(args.words) / 4), None)
    match_at = next((c["step"] for c in curve if c["match_accuracy"] > 0.6), None)
    result = {"args": vars(args), "encoder_config": m.get("encoder_config"), "clip": m["clip"],
              "cross_layers": a["cross_layers"], "seconds_per_step": round(seconds / args.steps, 4),
              "mlm_copies_from_step": copy_at, "match_above_0.6_from_step": match_at, "curve": curve}
    out_dir = ROOT / "bench" / "results"
    io.write_json(out_dir / "alignment_steps.json", result)
    never = f"not within {args.steps} steps"
    lines = [
        "# Steps the cross layers need to line up the two towers (toy data)", "",
        f"`python bench/alignment_steps.py --steps {args.steps} --words {args.words} --length {args.length} "
        f"--lr {args.lr} --batch {args.batch}`; params.yaml's encoder config, `{m['clip']}` CLIP tower and "
        f"{a['cross_layers']} cross layers, random init, losses MLM + MATCH.", "",
        f"- MLM copies from the CLIP side (loss < ln({args.words})/4 = {math.log(args.words) / 4:.2f}) from step: "
        f"**{copy_at or never}**",
        f"- MATCH accuracy above 0.6 from step: **{match_at or never}**",
        f"- {result['seconds_per_step']} s per step on {args.threads} thread(s)", "",
        "| step | MLM loss | MATCH accuracy |", "| --- | --- | --- |",
        *(f"| {c['step']} | {c['mlm_loss']:.3f} | {c['match_accuracy']:.3f} |" for c in curve),
    ]
    io.write_text(out_dir / "alignment_steps.md", "\n".join(lines) + "\n")
    print("\n".join(lines[:8]))


if __name__ == "__main__":
    main()
