"""Stage `captions`: the caption corpus, its word counts, and in the mechanism study the facts it states.

    deps:   models/tokenizer (the word counts cut words as the grounding analysis does), inputs (COCO's
            captions, where a file is named)
    outs:   data/captions: captions.json (COCO's layout, a copy where a file or a dataset is named), word_counts.json;
            with the mechanism study on, also captions_nofacts.json (the twin tower's) and facts.json

`grounding.captions`: `generated` (COCO-like scenes built from the corpus's concrete vocabulary; with the
mechanism study on, half of them fact captions: xdbert/data/synthetic/world.py), a `.json` file in the
layout of COCO's captions_train2017.json, or a `datasets` id / folder (`captions_hub_split`,
`captions_hub_column`). The grounding analysis counts its words here; the CLIP stand-in trains on them, and so
does the caption-text control (`adapt.text: captions`, stages/adapt.py).
"""
from __future__ import annotations

from xdbert import io
from xdbert import params as P
from xdbert.data import captions as C
from xdbert.paths import CAPTIONS, TOKENIZER
from xdbert.stage import run


def read(p: dict) -> tuple[str, C.CaptionSettings]:
    """(profile, settings): every param this stage reads, checked; tools/dvc_yaml.py records them for its
    `params:` in dvc.yaml."""
    return p["profile"], C.CaptionSettings.from_params(p)


def main() -> None:
    profile, s = read(P.load())
    s.check_file()

    from xdbert.analysis.grounding import WORD_COUNTS_FILE, caption_word_counts, wordpiece_tokenizer
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer

    tokenize, prefix, _ = wordpiece_tokenizer(load_encoder_tokenizer(TOKENIZER))
    made, source = s.load()
    counts = caption_word_counts(made["real"], tokenize, prefix=prefix)
    with io.atomic_path(CAPTIONS, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        # every source's captions, in one layout: the caption control (`adapt.text: captions`) reads them here
        C.write_coco_captions(made["real"], tmp / C.CAPTIONS_FILE, None if s.captions == "generated" else source)
        if s.mechanism.enabled:
            C.write_coco_captions(made["nofacts"], tmp / C.NOFACTS_FILE)
            io.write_json(tmp / C.FACTS_FILE, {"seed": s.mechanism.seed, **C.facts_record(s.mechanism.facts())})
        io.write_json(tmp / WORD_COUNTS_FILE, {"source": source, "captions": len(made["real"]),
                                               "counts": dict(counts.most_common())})
    print(f"captions ({profile}): {len(made['real']):,} from {source}; {len(counts):,} distinct words"
          + (f"; the facts of seed {s.mechanism.seed} and their twin" if s.mechanism.enabled else ""))


if __name__ == "__main__":
    run(main)
