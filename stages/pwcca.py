"""Stage `pwcca`: paper Table 2, PWCCA between word-embedding matrices before co-training.

    params: profile, model.{encoder, encoder_config, clip, clip_pretrained, seed},
            pwcca.{electra, clip_tower, pairs, eps, weight_by, min_words_ratio, seed}
    deps:   models/tokenizer (the language encoder's vocabulary), models/pretrained/encoder,
            models/pretrained/clip (CLIP-T as the adaptation starts from it)
    outs:   reports/table2.md, results/pwcca.json

Systems: `encoder` (the ORIGINAL language encoder, before adaptation), `electra` (a second encoder,
`pwcca.electra`), `clip` (CLIP-T's token embedding) and `random` (uniform noise shaped like the
encoder's rows). Models are loaded as the adapt stage starts from them: the encoder (for `random:<type>`
the pretrain_encoder stand-in) and the CLIP tower of the `pretrained` stage. Every pair is compared over
ONE word set: the whole lowercase words present in every vocabulary the pairs involve.
"""
from __future__ import annotations

from pathlib import Path


from xdbert import io
from xdbert import params as P
from xdbert.errors import PipelineError
from xdbert.stage import run

SYSTEMS = ("encoder", "electra", "clip", "random")
PAPER = {("encoder", "electra"): 0.5498, ("encoder", "clip"): 0.4980, ("electra", "clip"): 0.4645,
         ("encoder", "random"): 0.3569}
TOKENIZER = "models/tokenizer"
PRETRAINED_CLIP = "models/pretrained/clip"


def read_params() -> tuple[dict, dict, dict]:
    p = P.load()
    m, s = P.section(p, "model"), P.section(p, "pwcca")
    pairs = P.get(s, "pairs", "pwcca")
    if not isinstance(pairs, list) or not pairs:
        raise PipelineError(f"`pwcca.pairs` must be a non-empty list of [a, b] pairs of {', '.join(SYSTEMS)}; got {pairs!r}")
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]:
            raise PipelineError(f"entry {pair!r} of `pwcca.pairs` must be two different systems, e.g. [encoder, clip]")
        P.subset(pair, "pwcca.pairs entry", SYSTEMS)
    if any("electra" in pair for pair in pairs) and not P.get(s, "electra", "pwcca"):
        raise PipelineError("`pwcca.pairs` uses `electra` but `pwcca.electra` is empty: give an ELECTRA hub id or folder "
                            "(google/electra-base-discriminator) or drop those pairs")
    if not isinstance(s.get("eps"), (int, float)) or s["eps"] < 0:
        raise PipelineError(f"`pwcca.eps` must be a number >= 0; got {s.get('eps')!r}")
    P.choice(P.get(s, "weight_by", "pwcca"), "pwcca.weight_by", ("x", "y", "smaller"))
    P.positive(P.get(s, "min_words_ratio", "pwcca"), "pwcca.min_words_ratio", float)
    P.get(s, "seed", "pwcca")
    clip_tower = P.get(s, "clip_tower", "pwcca")
    if clip_tower and not (Path(clip_tower) / "clip_config.json").is_file():
        raise PipelineError(f"`pwcca.clip_tower: {clip_tower}` is not a saved CLIP tower folder (no clip_config.json); "
                            f"leave it empty for the tower the adaptation starts from ({PRETRAINED_CLIP})")
    return p, m, s


def main() -> None:
    p, m, s = read_params()
    pairs = [tuple(pair) for pair in s["pairs"]]
    used = {name for pair in pairs for name in pair}

    import numpy as np
    import torch

    from xdbert import pretraining
    from xdbert.analysis import pwcca as W
    from xdbert.clip import clip_tokenizer
    from xdbert.modeling import build_language_encoder, load_clip_tower
    from xdbert.reports import header
    from xdbert.tokenization import load_encoder_tokenizer

    tokenizer = load_encoder_tokenizer(TOKENIZER)
    vocab = tokenizer.get_vocab()
    torch.manual_seed(m["seed"])  # as the adapt stage builds the encoder
    encoder = build_language_encoder(pretraining.encoder_source(m), m.get("encoder_config"), vocab_size=len(vocab))
    matrices = {"encoder": encoder.get_input_embeddings().weight.detach().double().numpy()}
    words = {"encoder": W.wordpiece_words(vocab)}
    if "clip" in used:
        tower, cfg = load_clip_tower(s["clip_tower"] or PRETRAINED_CLIP)
        clip_name = cfg["clip"]
        matrices["clip"] = tower.token_embedding.weight.detach().double().numpy()
        words["clip"] = W.clip_bpe_words(clip_tokenizer(clip_name).encoder)
    if "electra" in used:
        electra = build_language_encoder(s["electra"])
        matrices["electra"] = electra.get_input_embeddings().weight.detach().double().numpy()
        words["electra"] = W.wordpiece_words(load_encoder_tokenizer(s["electra"]).get_vocab())

    shared = W.shared_words({k: v for k, v in words.items() if k in used | {"encoder"}})
    views = {name: W.embedding_rows(matrices[name], words[name], shared) for name in matrices}
    views["random"] = W.uniform_noise(views["encoder"].shape, s["seed"])
    results = W.pairwise(views, pairs, eps=float(s["eps"]), weight_by=s["weight_by"], min_ratio=float(s["min_words_ratio"]))

    names = {"encoder": f"language encoder `{m['encoder']}`", "electra": f"ELECTRA `{s.get('electra')}`",
             "clip": f"CLIP-T `{clip_name if 'clip' in used else m['clip']}`", "random": "uniform noise"}
    paper = p["profile"] == "paper"
    rows = []
    for (a, b), r in results.items():
        rows.append({"a": a, "b": b, "pwcca": round(r.value, 6), "shared_words": len(shared),
                     "widths": [int(views[a].shape[1]), int(views[b].shape[1])], "weighted_by": r.weighted_by,
                     "mean_cca": round(float(np.mean(r.rho)), 6), "paper": PAPER.get((a, b), PAPER.get((b, a))) if paper else None})
    io.write_json("results/pwcca.json", {"profile": p["profile"], "shared_words": len(shared), "eps": s["eps"],
                                         "weight_by": s["weight_by"], "systems": {k: names[k] for k in used},
                                         "pairs": {f"{r['a']}/{r['b']}": r for r in rows}})

    md = [header("Table 2: PWCCA of word embeddings before co-training", p["profile"],
                 ", ".join(names[k] for k in SYSTEMS if k in used), "-"),
          f"Embedding rows of the ORIGINAL (pre-adaptation) models over **{len(shared)} shared words**: whole lowercase "
          f"words present in every compared vocabulary (WordPiece `word`, CLIP BPE `word</w>`). RANDOM is U[-1, 1) "
          f"noise of the encoder's shape (seed {s['seed']}). PWCCA: projection-weighted mean of the canonical "
          f"correlations (Morcos et al., 2018), weights from the {s['weight_by']} view, covariance ridge eps={s['eps']}.",
          "", "The RANDOM row is the level two unrelated matrices reach with this many words and these widths (CCA "
          "fits noise with few words per dimension); compare the other rows with it, not with 0.",
          "", "| systems | PWCCA | mean CCA | shared words | widths |" + (" paper |" if paper else ""),
          "|---|---|---|---|---|" + ("---|" if paper else "")]
    for r in rows:
        label = f"{r['a'].upper()}/{r['b'].upper()}".replace("ENCODER", "L")
        line = f"| {label} | {r['pwcca']:.4f} | {r['mean_cca']:.4f} | {r['shared_words']} | {r['widths'][0]} / {r['widths'][1]} |"
        md.append(line + (f" {r['paper'] if r['paper'] is not None else '-'} |" if paper else ""))
    md += ["", "Systems: " + "; ".join(f"{k.upper().replace('ENCODER', 'L')} = {names[k]}" for k in SYSTEMS if k in used) + "."]
    io.write_text("reports/table2.md", "\n".join(md) + "\n")
    for r in rows:
        print(f"pwcca {r['a']}/{r['b']}: {r['pwcca']:.4f} over {r['shared_words']} words")


if __name__ == "__main__":
    run(main)
