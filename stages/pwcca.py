"""Stage `pwcca`: paper Table 2, PWCCA between word-embedding matrices before co-training.

    deps:   models/tokenizer (the vocabulary every family shares), models/pretrain_encoder (the stand-ins of
            `random:` families), models/pretrain_clip (CLIP-T as the adaptation starts from it)
    outs:   reports/table2.md, results/pwcca.json

Systems (`pwcca.pairs`): a family of `families` (its ORIGINAL encoder, before adaptation), `clip` (CLIP-T's
token embedding) and `random` (uniform noise shaped like the first family the pairs name). Models are
loaded as the adapt stages start from them: a family's hub encoder, or for `random:<type>` its
pretrain_encoder@<family> stand-in, and the CLIP tower of the `pretrain_clip` stage. Every pair is
compared over ONE word set: the whole lowercase words present in every vocabulary loaded.
"""
from __future__ import annotations

from xdbert import io
from xdbert import params as P
from xdbert.analysis import pwcca as W
from xdbert.model.families import family
from xdbert.model.settings import ModelSettings
from xdbert.paths import PRETRAIN_CLIP, PWCCA_METRICS, TOKENIZER, report
from xdbert.stage import run


def read(p: dict) -> tuple:
    """(profile, settings, each family's model settings, the systems' labels): every param this stage reads,
    checked; tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    s = W.PwccaSettings.from_params(p, files=False)
    models = {name: ModelSettings.from_params(p, name) for name in s.families}
    labels = W.system_labels({name: family(p, name).label for name in s.families})
    return p["profile"], s, models, labels


def main() -> None:
    profile, s, models, labels = read(P.load())
    s.check_files()

    import torch

    from xdbert.clip import clip_tokenizer
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.model.build import encoder_source
    from xdbert.model.encoders import build_language_encoder
    from xdbert.model.saving import load_clip_tower
    from xdbert.random_encoder import RANDOM_PREFIX
    from xdbert.reports.header import header

    vocab = load_encoder_tokenizer(TOKENIZER).get_vocab()
    matrices, words = {}, {}
    for name, m in models.items():
        torch.manual_seed(m.seed)  # as the adapt stage builds the encoder
        encoder = build_language_encoder(encoder_source(m.encoder, m.encoder_config, name), m.encoder_config,
                                         vocab_size=len(vocab))
        matrices[name] = encoder.get_input_embeddings().weight.detach().double().numpy()
        # a random: encoder was built on the trained vocabulary; a hub encoder comes with its own
        own = vocab if m.encoder.startswith(RANDOM_PREFIX) else load_encoder_tokenizer(m.encoder).get_vocab()
        words[name] = W.wordpiece_words(own)
    clip_name = models[s.families[0]].clip
    if W.CLIP in s.systems:
        tower, cfg = load_clip_tower(s.clip_tower or PRETRAIN_CLIP)
        clip_name = cfg["clip"]
        matrices[W.CLIP] = tower.token_embedding.weight.detach().double().numpy()
        words[W.CLIP] = W.clip_bpe_words(clip_tokenizer(clip_name).encoder)

    shared = W.shared_words(words)
    views = {name: W.embedding_rows(matrices[name], words[name], shared) for name in matrices}
    views[W.RANDOM] = W.uniform_noise(views[s.families[0]].shape, s.seed)
    results = W.pairwise(views, s.pairs, eps=float(s.eps), weight_by=s.weight_by, min_ratio=s.min_words_ratio,
                         convention=s.convention)

    names = W.system_names(labels, {name: m.encoder for name, m in models.items()}, clip_name, s.families[0])
    paper = profile == "paper"
    rows = W.table2_rows(results, views, len(shared), labels, paper)
    io.write_json(PWCCA_METRICS, {"profile": profile, "shared_words": len(shared), "eps": s.eps,
                                  "convention": s.convention, "weight_by": s.weight_by,
                                  "systems": {k: names[k] for k in s.systems},
                                  "pairs": {f"{r['a']}/{r['b']}": r for r in rows}})
    head = header("Table 2: PWCCA of word embeddings before co-training", profile,
                  ", ".join(names[k] for k in s.systems), "-")
    io.write_text(report("table2"), W.table2_markdown(head, rows, labels, names, len(shared), s, paper))
    for r in rows:
        print(f"pwcca {labels[r['a']]}/{labels[r['b']]}: {r['pwcca']:.4f} over {r['shared_words']} words")


if __name__ == "__main__":
    run(main)
