"""Stage `pretrained`: CLIP's text tower as the adaptation starts from it, for the CLIP-T finetuning row.

Paper profile: open_clip `model.clip` with `model.clip_pretrained` weights (e.g. ViT-B-32 / openai).
Embedded profile: the same random weights the adapt stage starts from (same seed, same build order: the
pretrained stand-in encoder is loaded first, then the CLIP tower is built).
"""
from xdbert import params
from xdbert.stage import run


def main() -> None:
    m = params.section(params.load(), "model")

    import torch
    from transformers import AutoTokenizer

    from xdbert import pretraining
    from xdbert.finetuning import save_clip_tower
    from xdbert.modeling import CLIPTextTower, build_language_encoder

    torch.manual_seed(m["seed"])
    if m["encoder"].startswith("random:"):
        # A random CLIP's weights depend on the generator state: build in the adapt stage's order
        # (encoder first) so CLIP-T starts from exactly the weights the adaptation starts from.
        vocab_size = len(AutoTokenizer.from_pretrained("models/tokenizer"))
        build_language_encoder(pretraining.encoder_source(m), m.get("encoder_config"), vocab_size=vocab_size)
    tower = CLIPTextTower.build(m["clip"], m["clip_pretrained"])
    save_clip_tower(tower, "models/pretrained/clip", m["clip"], m["clip_pretrained"])
    print(f"pretrained: CLIP text tower {m['clip']} ({m['clip_pretrained'] or 'random init'}) -> models/pretrained/clip")


if __name__ == "__main__":
    run(main)
