"""What a language encoder named `random:<model_type>` is: random weights from transformers' config of that type.

Below `data` and `model` alike: the tokenizer stage trains a vocabulary for such an encoder and reads its
positions from the config, the model builds it. Imports nothing heavy at the top, so settings checks stay quick.
"""
from __future__ import annotations

import functools

from xdbert.errors import PipelineError

RANDOM_PREFIX = "random:"   # an encoder named random:<model_type> starts from random weights, not a checkpoint


def random_default_config(encoder: str, encoder_config: dict | None = None):
    """The default transformers config of `random:<model_type>`, once the type is known to transformers and every
    key of `encoder_config` is one of its settings: transformers would keep a misspelled key (`hiden_size`) as a
    stray attribute and build the default size. One object per model type, shared: read it, never change it."""
    import difflib

    default = _default_config(encoder)
    for key in encoder_config or {}:
        if not hasattr(default, key):
            close = difflib.get_close_matches(key, list(default.to_dict()), n=1)
            raise PipelineError(f"`{key}` in the encoder_config of `{encoder}` is not a setting of transformers' "
                                f"{type(default).__name__}" + (f" (did you mean `{close[0]}`?)" if close else ""))
    return default


@functools.cache
def _default_config(encoder: str):
    """One config object per model type, read-only: building one takes about 10 ms, and a params check asks
    for it once per family and stage."""
    from transformers import CONFIG_MAPPING  # here, not at the top: this module imports nothing heavy

    model_type = encoder[len(RANDOM_PREFIX):]
    if model_type not in CONFIG_MAPPING:
        raise PipelineError(f"unknown encoder model type `{model_type}` in the encoder `{encoder}`; use random:<a "
                            f"transformers model type> such as random:bert or random:electra")
    return CONFIG_MAPPING[model_type]()
