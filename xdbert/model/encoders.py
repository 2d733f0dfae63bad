"""The language encoder ("L"): any transformers encoder (BERT, ELECTRA, RoBERTa, ...), pretrained or random.

`random:<model_type>` is built from a transformers config; anything else (a hub id, a local
`save_pretrained` folder) is loaded with its own config and vocabulary. A random encoder starts the
adaptation from its pretraining stand-in (`xdbert.model.build.encoder_source`, the `pretrain_encoder@<family>`
stage's output).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel

from xdbert import io
from xdbert.errors import PipelineError
from xdbert.hub import hub_request, quiet_loading, source
from xdbert.random_encoder import RANDOM_PREFIX, random_default_config

if TYPE_CHECKING:
    from xdbert.model.layers import MaskedTokenHead

# Where a family's pretrained MLM head lives in its `AutoModelForMaskedLM` checkpoint:
# (transform dense, transform LayerNorm, decoder bias). All are dense -> act -> LayerNorm -> tied decoder,
# the layout of `MaskedTokenHead`. ELECTRA discriminators ship no MLM head; their head starts random.
PRETRAINED_MLM_HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
}


def build_language_encoder(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PreTrainedModel:
    """The language encoder ("L"): `random:<model_type>` builds one from a config, anything else loads.

    `random:bert` with no overrides is BERT-base with random weights; `config_overrides` are keyword
    arguments of the transformers config (hidden_size, num_hidden_layers, ...) and `vocab_size` the size
    of the tokenizer the pipeline trained. A hub id or a local `save_pretrained` folder is loaded with
    `AutoModel.from_pretrained` (its own config and vocabulary; overrides and vocab_size are not used);
    an offline machine gets a PipelineError saying what to do.
    """
    if name.startswith(RANDOM_PREFIX):
        return AutoModel.from_config(random_encoder_config(name, config_overrides, vocab_size))
    # A pretrained encoder comes with its own config and vocabulary: overrides and vocab_size are not
    # used (params.yaml says `encoder_config` is only for random:<model_type>).
    for weights in sorted(Path(name).glob("*.safetensors")) if Path(name).is_dir() else []:
        io.check_safetensors(weights)  # a damaged local folder (the encoder stand-in's): one line, not a traceback
    try:
        with hub_request(f"language encoder `{name}`"), quiet_loading():  # offline: PipelineError with what to do
            model, info = AutoModel.from_pretrained(source(name), output_loading_info=True)
    except (OSError, ValueError) as e:  # not a network failure: a wrong name or folder
        raise PipelineError(
            f"cannot load the language encoder `{name}` ({e}); use a hub id such as "
            f"bert-base-uncased, a local save_pretrained folder, or random:<model_type>"
        ) from e
    # transformers initialises weights it did not find and only logs it: an encoder that silently starts
    # partly random would make every result wrong, so that is an error here. The pooler is new by design
    # where the checkpoint is an MLM-only one (the encoder stand-in, ELECTRA): no loss here trains it,
    # and finetuning does.
    missing = [k for k in info.get("missing_keys", []) if not k.startswith("pooler.")]
    if missing:
        raise PipelineError(f"language encoder `{name}` lacks {len(missing)} of its weights ({', '.join(sorted(missing)[:4])}"
                            f"{', ...' if len(missing) > 4 else ''}): transformers would start them at random. Check the "
                            f"checkpoint (a damaged download: `xdbert fetch` again)")
    return model


def random_encoder_config(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PretrainedConfig:
    """The transformers config of `random:<model_type>` with the overrides and the trained vocabulary's size."""
    random_default_config(name, config_overrides)
    overrides = dict(config_overrides or {})
    if vocab_size is not None:
        overrides["vocab_size"] = int(vocab_size)
    return AutoConfig.for_model(name[len(RANDOM_PREFIX):], **overrides)


def build_masked_lm(name: str, config_overrides: dict | None = None, vocab_size: int | None = None) -> PreTrainedModel:
    """A random `random:<model_type>` encoder with its family's MLM head (`AutoModelForMaskedLM`), to pretrain."""
    if not name.startswith(RANDOM_PREFIX):
        raise ValueError(f"only random:<model_type> encoders are pretrained here; `{name}` is used as downloaded")
    return AutoModelForMaskedLM.from_config(random_encoder_config(name, config_overrides, vocab_size))


def load_pretrained_mlm_head(name: str, head: "MaskedTokenHead") -> bool:
    """Copy the MLM head of checkpoint `name` into `head` when the checkpoint has one; True if it did.

    Starting adaptation (and the MLM-only baseline) from BERT's own MLM head matters: a random head
    sends large random gradients into the encoder during the first steps.
    """
    with hub_request(f"MLM head of `{name}`"):
        folder = source(name)
        keys = PRETRAINED_MLM_HEADS.get(AutoConfig.from_pretrained(folder).model_type)
        if keys is None:
            return False
        with quiet_loading():
            mlm_model, info = AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
    dense, norm, bias = keys
    wanted = [f"{dense}.weight", f"{dense}.bias", f"{norm}.weight", f"{norm}.bias", bias]
    if set(wanted) & set(info.get("missing_keys", [])):
        return False  # e.g. an ELECTRA discriminator: its generator head would be random
    state = mlm_model.state_dict()
    with torch.no_grad():
        head.dense.weight.copy_(state[f"{dense}.weight"])
        head.dense.bias.copy_(state[f"{dense}.bias"])
        head.layer_norm.weight.copy_(state[f"{norm}.weight"])
        head.layer_norm.bias.copy_(state[f"{norm}.bias"])
        head.bias.copy_(state[bias])
    return True
