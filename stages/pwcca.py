"""Stage `pwcca`: paper Table 2, PWCCA between word-embedding matrices before co-training.

    params: profile, model.{encoder, encoder_config, clip, clip_pretrained, seed},
            pwcca.{electra, clip_tower, pairs, eps, convention, weight_by, min_words_ratio, seed}
    deps:   models/tokenizer (the language encoder's vocabulary), models/pretrain_encoder,
            models/pretrain_clip (CLIP-T as the adaptation starts from it)
    outs:   reports/table2.md, results/pwcca.json

Systems: `encoder` (the ORIGINAL language encoder, before adaptation), `electra` (a second encoder,
`pwcca.electra`), `clip` (CLIP-T's token embedding) and `random` (uniform noise shaped like the
encoder's rows). Models are loaded as the adapt stage starts from them: the encoder (for `random:<type>`
the pretrain_encoder stand-in) and the CLIP tower of the `pretrain_clip` stage. Every pair is compared
over ONE word set: the whole lowercase words present in every vocabulary the pairs involve.
"""
from __future__ import annotations

from xdbert import io
from xdbert import params as P
from xdbert.analysis import pwcca as W
from xdbert.paths import PRETRAIN_CLIP, PWCCA_METRICS, TOKENIZER, report
from xdbert.stage import run


def main() -> None:
    p = P.load()
    m = P.section(p, "model")
    s = W.PwccaSettings.from_params(p)
    used = s.systems

    import torch

    from xdbert.clip import clip_tokenizer
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.model.encoders import build_language_encoder, encoder_source
    from xdbert.model.saving import load_clip_tower
    from xdbert.reports.header import header

    tokenizer = load_encoder_tokenizer(TOKENIZER)
    vocab = tokenizer.get_vocab()
    torch.manual_seed(m["seed"])  # as the adapt stage builds the encoder
    encoder = build_language_encoder(encoder_source(m["encoder"], m.get("encoder_config")), m.get("encoder_config"), vocab_size=len(vocab))
    matrices = {"encoder": encoder.get_input_embeddings().weight.detach().double().numpy()}
    words = {"encoder": W.wordpiece_words(vocab)}
    clip_name = m["clip"]
    if "clip" in used:
        tower, cfg = load_clip_tower(s.clip_tower or PRETRAIN_CLIP)
        clip_name = cfg["clip"]
        matrices["clip"] = tower.token_embedding.weight.detach().double().numpy()
        words["clip"] = W.clip_bpe_words(clip_tokenizer(clip_name).encoder)
    if "electra" in used:
        electra = build_language_encoder(s.electra)
        matrices["electra"] = electra.get_input_embeddings().weight.detach().double().numpy()
        words["electra"] = W.wordpiece_words(load_encoder_tokenizer(s.electra).get_vocab())

    shared = W.shared_words({k: v for k, v in words.items() if k in used | {"encoder"}})
    views = {name: W.embedding_rows(matrices[name], words[name], shared) for name in matrices}
    views["random"] = W.uniform_noise(views["encoder"].shape, s.seed)
    results = W.pairwise(views, s.pairs, eps=float(s.eps), weight_by=s.weight_by, min_ratio=s.min_words_ratio,
                         convention=s.convention)

    names = W.system_names(m["encoder"], s.electra, clip_name)
    paper = p["profile"] == "paper"
    rows = W.table2_rows(results, views, len(shared), paper)
    io.write_json(PWCCA_METRICS, {"profile": p["profile"], "shared_words": len(shared), "eps": s.eps,
                                  "convention": s.convention, "weight_by": s.weight_by, "systems": {k: names[k] for k in used},
                                  "pairs": {f"{r['a']}/{r['b']}": r for r in rows}})
    head = header("Table 2: PWCCA of word embeddings before co-training", p["profile"],
                  ", ".join(names[k] for k in W.SYSTEMS if k in used), "-")
    io.write_text(report("table2"), W.table2_markdown(head, rows, names, used, len(shared), s, paper))
    for r in rows:
        print(f"pwcca {r['a']}/{r['b']}: {r['pwcca']:.4f} over {r['shared_words']} words")


if __name__ == "__main__":
    run(main)
