"""2. The model: the XDBERT cross-modal model, its parts, saving, and its assembly for an adaptation variant.

Read in this order: `encoders` (the language encoder), `clip_tower` (CLIP's text tower), `layers` (cross-modal
layers and pretraining heads), `modeling` (`XDBertConfig`, `XDBertModel`), `saving`, `build` (the model an
`adapt` variant trains, from params). `settings` holds the `model` section and `families` the `families` section; both import nothing heavy.
"""

LOSSES = ("mlm", "match", "cliptc", "distill", "kl")  # the adaptation objectives, in the order every report lists them
PAPER_LOSSES = LOSSES[:3]  # the paper's; `distill` and `kl` are the mechanism study's encoder-side controls, never defaults
UNSCORED = ("distill", "kl")  # objectives without an accuracy: a distance between states or distributions has no right answer
IGNORE_INDEX = -100  # label of positions without a target, as in transformers and F.cross_entropy
