"""What `adapt.precision` and `finetune.precision` may say (xdbert.training.mixed_precision).

A module of its own: the training code that reads it imports no params.
"""

PRECISIONS = ("auto", "bf16", "fp16", "no")
