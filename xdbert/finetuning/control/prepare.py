"""Preparing a finetuning job: one model and one task, read and tokenized once.

`prepare` reads the model's config, takes Table 5's learning rate for its family's size class (for CLIP-T,
its width's) and tokenizes every split once with fast batched tokenizers (xdbert.finetuning.compute.data).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from xdbert import io
from xdbert.data.tokenization.vocab import check_tokenizer_folder
from xdbert.errors import PipelineError
from xdbert.finetuning.compute import data as fd
from xdbert.finetuning.compute.heads import encoder_head_class
from xdbert.finetuning.compute.job import Job
from xdbert.finetuning.compute.keys import job_identity
from xdbert.finetuning.control.runs import MODEL_KINDS
from xdbert.finetuning.control.settings import FinetuneSettings, size_of
from xdbert.model.files import CLIP_CONFIG, CROSSMODAL_CONFIG
from xdbert.model.families import Family


def prepare(model_kind: str, model_path: str | Path, tables: dict, settings: FinetuneSettings,
            tokenizer_dir: str | Path | None = None, run_cache: str | Path = "", protocol: str = "table1",
            family: Family | None = None) -> Job:
    """Read the model's config and tokenize every split of `settings.task` once (fast batched tokenizers).

    encoder: the tokenizer saved in the model folder. full: the BERT tokenizer in `tokenizer_dir`
    (the cross-modal folder holds none) and CLIP blocks. clip: CLIP blocks only. The `family` (None for
    CLIP-T) gives Table 5's size class and the layer-wise lr decay; without one, the model's width decides the
    size and the decay is off. Finished runs are kept in `run_cache` ("" = nowhere).
    """
    from transformers import AutoConfig, AutoTokenizer

    spec = settings.task
    if model_kind not in MODEL_KINDS:
        raise PipelineError(f"unknown model kind {model_kind!r}; allowed: {', '.join(MODEL_KINDS)}")
    model_path = Path(model_path)
    data: dict[str, fd.Encoded] = {}
    if model_kind == "full" and tokenizer_dir is None:
        raise PipelineError("the full cross-modal model keeps no tokenizer: pass tokenizer_dir (models/tokenizer)")
    if model_kind in ("encoder", "full"):
        tok_dir = model_path if model_kind == "encoder" else Path(tokenizer_dir)
        check_tokenizer_folder(tok_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        except (OSError, ValueError) as e:
            raise PipelineError(f"cannot load a tokenizer from {tok_dir} ({e}); run the stage that writes it") from e
        if not tokenizer.is_fast:
            raise PipelineError(f"the tokenizer in {tok_dir} is not a fast (Rust) tokenizer; save one with tokenizer.json")
        encoder_dir = model_path if model_kind == "encoder" else model_path / "encoder"
        encoder_config = AutoConfig.from_pretrained(encoder_dir)
        width = encoder_config.hidden_size
        fd.check_positions("finetune.max_len", settings.max_len, encoder_config, encoder_dir)
        data = {split: fd.encode_bert(tokenizer, spec, t, settings.max_len) for split, t in tables.items()}

    eot_id = 49407
    # Model code is imported here, once: workers forked later inherit it instead of each paying seconds.
    if model_kind == "encoder":
        encoder_head_class(model_path, spec)
    else:
        from xdbert.model import saving  # noqa: F401  (preloaded for the workers: open_clip, the cross-modal model)

        if model_kind == "full":
            clip_name = io.read_json(model_path / CROSSMODAL_CONFIG)["clip"]
        else:
            import open_clip

            from xdbert.clip import register_configs

            clip_name = io.read_json(model_path / CLIP_CONFIG)["clip"]
            register_configs()
            width = open_clip.get_model_config(clip_name)["text_cfg"]["width"]
        to_blocks, eot_id = fd.clip_block_encoder(clip_name)
        for split, t in tables.items():
            blocks = fd.encode_clip(to_blocks, spec, t, settings.clip_blocks_per_sentence)  # uint16
            if model_kind == "clip":
                data[split] = fd.Encoded(idx=t.column("idx").to_numpy().astype(np.int64), labels=fd.labels_of(spec, t),
                                         choices=blocks.shape[1], inputs={}, pad_ids={})
            data[split].clip_ids = blocks
    size = family.size if family else size_of(width)
    hyperparameters = settings.hyperparameters(size, model_kind, protocol, family.layer_lr_decay if family else 1.0)
    job = Job(model_kind, str(model_path), spec, hyperparameters, data, eot_id, size,
              run_cache=str(run_cache) if run_cache else "")
    job.identity = job_identity(job)
    return job
