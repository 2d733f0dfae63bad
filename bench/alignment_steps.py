"""How many optimizer steps the cross layers need to line up two towers that start unaligned.

MATCH and copying across the towers both need the cross-attention to find, for a language token, the
CLIP token that says the same thing. Nothing in the initial weights does that: the cross layers are
random and, in the embedded profile, so is the CLIP tower. This measures how long learning it takes on
the easiest possible data, so the adapt stage's MATCH accuracy can be read against it.

Data: `--words` words, each one BERT id and one CLIP id; a window is `--length` random words, the
same on both sides ([CLS] w1..wn [SEP] and [SOT] w1..wn [EOT], so even positions line up). With
`--topics K`, K topics of `--topic-words` more words each; a window belongs to one topic, and each of
its positions holds one of that topic's words with probability `--topic-share` (else a shared word),
so a window and another window's text differ in topic, as wiki103 articles do. `--cluster S` gives the
words of each topic a shared direction in the token embeddings (each row becomes S * topic direction +
(1 - S) * its random row), in both towers or only the language one (`--cluster-towers`), the way
pretrained towers place related words near each other. Model:
`XDBertModel` with params.yaml's encoder config, CLIP tower and cross layers, losses `--losses`: MLM
(BERT's masking) and MATCH (half the windows get another window's CLIP text), drawn by adaptation's own
`masking.adaptation_inputs`, or MLM alone, where every window sees its own CLIP text. `--mlm-negatives
own` keeps MLM targets only in windows that see their own CLIP text (`adapt.mlm_negatives: false`);
`all` (the default, as in LXMERT) has them in the negatives too. AdamW at `--lr`, batch `--batch`;
the new modules start at normal(0, `--init-range`) (default: the encoder's 0.02).

Reported: the MLM loss and MATCH accuracy over training (means over `--every` steps), the first
step at which MLM falls below ln(V)/4, V the vocabulary of shared and topic words (copying from the
CLIP side: without it the loss stays near ln(V) - 1) and at which MATCH accuracy exceeds 0.6, and the seconds per step.

    python bench/alignment_steps.py [--losses mlm,match] [--mlm-negatives all] [--steps 6000] [--words 20] [--length 8]
                                    [--topics 0 --topic-words 12 --topic-share 0.5] [--init-range 0.02] [--cluster 0 --cluster-towers both]

Writes <out>/alignment_steps_<losses>[_own][_topics<K>][_init<std>][_cluster<S>[_language]].md and .json (bench/results/alignment_steps_mlm_match.md by default).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import xdbert  # noqa: F401, E402  (first: it fixes the CPU kernels and threads before torch and numpy load)
import torch  # noqa: E402

from xdbert import io, params  # noqa: E402
from xdbert.adaptation import masking  # noqa: E402
from xdbert.model import modeling  # noqa: E402
from provenance import code_version, describe  # noqa: E402

CLS, SEP, MASK, FIRST_WORD = 2, 3, 4, 10      # BERT ids; ids below FIRST_WORD are special
SOT, EOT, FIRST_CLIP = 49406, 49407, 1000     # CLIP ids; word w is FIRST_CLIP + 7 * w


def windows(words: int, length: int, batch: int, gen: torch.Generator, topics: int = 0, topic_words: int = 0,
            topic_share: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(bert_ids (B, length + 2), clip_ids (B, 1, 77)) of the same random words.

    Word ids: 0..words-1 are shared; topic t owns words + t * topic_words .. + topic_words - 1."""
    w = torch.randint(words, (batch, length), generator=gen)
    if topics:
        topic = torch.randint(topics, (batch, 1), generator=gen)
        own = words + topic * topic_words + torch.randint(topic_words, (batch, length), generator=gen)
        w = torch.where(torch.rand(batch, length, generator=gen) < topic_share, own, w)
    bert = torch.cat([torch.full((batch, 1), CLS), FIRST_WORD + w, torch.full((batch, 1), SEP)], dim=1)
    clip = torch.zeros(batch, 1, 77, dtype=torch.long)
    clip[:, 0, 0], clip[:, 0, length + 1] = SOT, EOT
    clip[:, 0, 1:length + 1] = FIRST_CLIP + 7 * w
    return bert, clip


@torch.no_grad()
def cluster_topics(model: modeling.XDBertModel, args: argparse.Namespace) -> None:
    """Move each topic's word embeddings toward one random direction per topic and tower."""
    towers = [(model.encoder.get_input_embeddings().weight, FIRST_WORD, 1)]
    if args.cluster_towers == "both":
        towers.append((model.clip.token_embedding.weight, FIRST_CLIP, 7))
    for t in range(args.topics):
        words = torch.arange(args.words + t * args.topic_words, args.words + (t + 1) * args.topic_words)
        for weight, first, stride in towers:
            rows = first + stride * words
            direction = torch.randn(weight.shape[1]) * weight.std()
            weight[rows] = args.cluster * direction + (1 - args.cluster) * weight[rows]


def table(curve: list[dict], match: bool) -> list[str]:
    head = "| step | MLM loss | MATCH accuracy |\n| --- | --- | --- |" if match else "| step | MLM loss |\n| --- | --- |"
    rows = [f"| {c['step']} | {c['mlm_loss']:.3f} |" + (f" {c['match_accuracy']:.3f} |" if match else "") for c in curve]
    return [head, *rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--losses", default="mlm,match", choices=["mlm,match", "mlm"])
    ap.add_argument("--mlm-negatives", default="all", choices=["all", "own"],
                    help="MLM targets in every window (all) or only where CLIP sees the window's own text (own)")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--words", type=int, default=20)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--topics", type=int, default=0, help="topics a window belongs to (0: no topics)")
    ap.add_argument("--topic-words", type=int, default=12, help="words of each topic, besides the --words shared ones")
    ap.add_argument("--topic-share", type=float, default=0.5, help="chance that a position holds a word of the window's topic")
    ap.add_argument("--init-range", type=float, default=None, help="std of the new modules' init (default: the encoder's)")
    ap.add_argument("--cluster", type=float, default=0.0, help="weight of a shared direction in each topic's word embeddings")
    ap.add_argument("--cluster-towers", default="both", choices=["both", "language"], help="which towers' embeddings --cluster shapes")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the report")
    args = ap.parse_args()
    if args.cluster and not args.topics:
        ap.error("--cluster shapes the topics' words: it needs --topics")
    losses = args.losses.split(",")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    p = params.load(ROOT / "params.yaml")
    m, a = p["model"], p["adapt"]
    vocab = args.words + args.topics * args.topic_words
    config = modeling.XDBertConfig(
        encoder=m["encoder"], encoder_config=m.get("encoder_config") or {}, vocab_size=FIRST_WORD + vocab,
        clip=m["clip"], clip_heads=a["clip_heads"], clip_blocks=1, cross_layers=a["cross_layers"], losses=losses,
        init_range=args.init_range)
    model = modeling.XDBertModel.build(config)
    if args.cluster:
        cluster_topics(model, args)
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)

    curve, window, t0 = [], [], time.time()
    for step in range(args.steps):
        bert, clip = windows(args.words, args.length, args.batch, gen, args.topics, args.topic_words, args.topic_share)
        batch = masking.adaptation_inputs(
            {"bert_ids": bert, "bert_mask": torch.ones_like(bert), "clip_ids": clip}, losses, gen,
            vocab_size=FIRST_WORD + vocab, special_ids=range(FIRST_WORD), mask_id=MASK, eot_id=EOT,
            mlm_negatives=args.mlm_negatives == "all")
        out = model(**batch)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
        window.append({"mlm_loss": out["mlm_loss"].item()})
        if "match_labels" in batch:
            window[-1]["match_accuracy"] = out["match_correct"].item() / args.batch
        if len(window) == args.every:
            curve.append({"step": step + 1, **{k: sum(w[k] for w in window) / len(window) for k in window[0]}})
            window = []
            print(json.dumps(curve[-1]), flush=True)
    seconds = time.time() - t0
    report({k: v for k, v in vars(args).items() if k != "out"}, m, a, curve, round(seconds / args.steps, 4), Path(args.out))


def report(args: dict, m: dict, a: dict, curve: list[dict], seconds_per_step: float, out_dir: Path) -> None:
    """Write <out_dir>/alignment_steps_<losses>.json and .md from a training curve."""
    losses = args["losses"].split(",")
    vocab = args["words"] + args["topics"] * args["topic_words"]
    copy_at = next((c["step"] for c in curve if c["mlm_loss"] < math.log(vocab) / 4), None)
    match_at = next((c["step"] for c in curve if c.get("match_accuracy", 0) > 0.6), None)
    result = {**code_version(), "args": args, "encoder_config": m.get("encoder_config"), "clip": m["clip"],
              "cross_layers": a["cross_layers"], "seconds_per_step": seconds_per_step,
              "mlm_copies_from_step": copy_at, "match_above_0.6_from_step": match_at, "curve": curve}
    own = "match" in losses and args.get("mlm_negatives") == "own"
    # (command-line flags, file-name suffix) of each option that was used
    language_only = args["cluster_towers"] == "language"
    used = [(f" --topics {args['topics']} --topic-words {args['topic_words']} --topic-share {args['topic_share']}",
             f"_topics{args['topics']}") if args["topics"] else None,
            (f" --init-range {args['init_range']}", f"_init{args['init_range']}") if args["init_range"] else None,
            (f" --cluster {args['cluster']}" + (" --cluster-towers language" if language_only else ""),
             f"_cluster{args['cluster']}" + ("_language" if language_only else "")) if args["cluster"] else None]
    flags = "".join(f for f, _ in filter(None, used))
    stem = "alignment_steps_" + "_".join(losses) + ("_own" if own else "") + "".join(x for _, x in filter(None, used))
    io.write_json(out_dir / f"{stem}.json", result)
    never = f"not within {args['steps']} steps"
    lines = [
        "# Steps the cross layers need to line up the two towers (toy data)", "",
        f"`python bench/alignment_steps.py --losses {args['losses']}{' --mlm-negatives own' if own else ''} --steps {args['steps']} --words {args['words']} "
        f"--length {args['length']}{flags} --lr {args['lr']} --batch {args['batch']}`; params.yaml's encoder config, "
        f"`{m['clip']}` CLIP tower and {a['cross_layers']} cross layers, random init"
        + (f" (each topic's word embeddings pulled toward a shared direction in the {args['cluster_towers']} tower(s))" if args["cluster"] else "")
        + ", losses "
        f"{' + '.join(l.upper() for l in losses)}"
        + (", MLM targets only in windows that see their own CLIP text." if own else "."), "",
        f"- MLM copies from the CLIP side (loss < ln({vocab})/4 = {math.log(vocab) / 4:.2f}) from step: "
        f"**{copy_at or never}**",
        *([f"- MATCH accuracy above 0.6 from step: **{match_at or never}**"] if "match" in losses else []),
        f"- {seconds_per_step} s per step on {args['threads']} thread(s)", "", describe(result), "",
        *table(curve, "match" in losses),
    ]
    io.write_text(out_dir / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines[:8]))


if __name__ == "__main__":
    main()
