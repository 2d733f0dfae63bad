"""The embedded profile's stand-in for a pretrained language encoder.

The paper adapts BERT/ELECTRA as released: encoders whose attention already lines up matching words of
two texts, which QNLI, QQP and MATCH all need. A random-init encoder has no such heads, and a few hundred
finetuning steps do not grow them (QNLI and QQP stayed at 52-55% without this stage). So a random encoder
is first trained with MLM on pairs of corpus sentences: the second sentence restates the first (its
words rotated half of the time, so a fixed offset cannot copy) and is masked far more, so its targets
are found by looking up the same words in the first sentence.

Hub encoders (the paper profile) are used as downloaded: `encoder_source` returns their name unchanged
and no stand-in is trained for them.
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from xdbert import masking, training
from xdbert.errors import PipelineError
from xdbert.adaptation import model_identity

OUTPUT_DIR = "models/pretrained/encoder"

# The modules of each family's `...ForMaskedLM` that turn hidden states into vocabulary logits, in order.
# They act on each position alone, so they can run on the target rows only: the vocabulary-wide decoder at
# every position was half of each pretraining step (a 4,000-word vocabulary against a 64-wide encoder).
MLM_HEAD_MODULES = {
    "bert": ("cls",),
    "roberta": ("lm_head",),
    "xlm-roberta": ("lm_head",),
    "electra": ("generator_predictions", "generator_lm_head"),
}


def encoder_source(model_params: dict) -> str:
    """Where adaptation (and everything that starts from the original encoder) loads the encoder:
    the pretrained stand-in for a `random:<type>` encoder, the hub id or folder otherwise."""
    from xdbert.modeling import RANDOM_PREFIX, random_encoder_config

    name = model_params["encoder"]
    if not name.startswith(RANDOM_PREFIX):
        return name
    random_encoder_config(name, model_params.get("encoder_config"))  # an unknown model type is named here
    if not (Path(OUTPUT_DIR) / "config.json").is_file():
        raise PipelineError(f"missing {OUTPUT_DIR}: a `model.encoder: {name}` encoder starts from its pretraining "
                            f"stand-in; run `dvc repro pretrain_encoder`")
    return OUTPUT_DIR


@dataclass
class PretrainSettings:
    steps: int
    batch_size: int
    lr: float
    mlm_prob: float          # targets in the first sentence
    restate_mask_prob: float  # targets in the restating second sentence
    warmup_ratio: float
    weight_decay: float
    max_len: int
    checkpoint_every: int
    seed: int


def split_sentences(texts: list[str], min_words: int = 4) -> list[str]:
    """Sentences of the corpus documents (split after . ! ?), the short ones dropped."""
    out = []
    for text in texts:
        out.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= min_words)
    return out


def restated_pairs(sentences: list[str], batch_size: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """`batch_size` (sentence, restatement) pairs; half of the restatements have their words rotated."""
    first, second = [], []
    for _ in range(batch_size):
        words = rng.choice(sentences).split()
        first.append(" ".join(words))
        if rng.random() < 0.5:
            k = rng.randrange(1, len(words))
            words = words[k:] + words[:k]
        second.append(" ".join(words))
    return first, second


def masked_batch(tokenizer, first: list[str], second: list[str], s: PretrainSettings, generator: torch.Generator
                 ) -> dict[str, torch.Tensor]:
    """Tokenized pairs with BERT's masking: `mlm_prob` of the first sentence, `restate_mask_prob` of the second."""
    enc = tokenizer(first, second, padding=True, truncation=True, max_length=s.max_len, return_tensors="pt")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    types = enc.get("token_type_ids")
    if types is None:  # encoders without segment ids: the second sentence starts after the first [SEP]
        types = (torch.cumsum((ids == tokenizer.sep_token_id).long(), dim=1) > 0).long() * attention
    token_ids = dict(vocab_size=len(tokenizer), special_ids=tokenizer.all_special_ids, mask_id=tokenizer.mask_token_id,
                     generator=generator)
    inputs, labels_a = masking.mask_for_mlm(ids, attention * (types == 0), prob=s.mlm_prob, **token_ids)
    inputs, labels_b = masking.mask_for_mlm(inputs, attention * (types == 1), prob=s.restate_mask_prob, **token_ids)
    labels = torch.where(labels_a != masking.IGNORE_INDEX, labels_a, labels_b)
    batch = {"input_ids": inputs, "attention_mask": attention, "labels": labels}
    if "token_type_ids" in enc:
        batch["token_type_ids"] = enc["token_type_ids"]
    return batch


def target_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(vocabulary logits at the target positions (n, vocab), their labels (n,)) of a `...ForMaskedLM`.

    Families in `MLM_HEAD_MODULES` decode only the targets; any other family decodes every position through
    its own forward, which gives the same logits more slowly.
    """
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    labels = batch["labels"]
    targets = labels != masking.IGNORE_INDEX
    heads = MLM_HEAD_MODULES.get(model.config.model_type)
    if heads is None:
        return model(**inputs).logits[targets], labels[targets]
    hidden = model.base_model(**inputs).last_hidden_state[targets]
    for name in heads:
        hidden = getattr(model, name)(hidden)
    return hidden, labels[targets]


def pretrain(model: torch.nn.Module, tokenizer, sentences: list[str], s: PretrainSettings, checkpoint: Path,
             log: Callable[[dict, int], None] | None = None, stop_after: int | None = None) -> dict:
    """Train a transformers `...ForMaskedLM` for `s.steps` steps; resume from `checkpoint` when it matches.

    Each step's pairs and masking are drawn from (seed, step), so a resumed run takes the same steps.
    Returns the mean loss and target accuracy of the first and last 10% of the steps.
    """
    optimizer, schedule = training.optimizer_and_schedule(model, s.lr, s.weight_decay, s.warmup_ratio, s.steps)
    fp = training.fingerprint(asdict(s), len(sentences), *model_identity(model))
    state = training.load_checkpoint(checkpoint, fp)
    start, history = 0, []
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start, history = state["step"], state["history"]
        print(f"resuming from {checkpoint} at step {start}/{s.steps}")
    model.train()
    t0 = time.time()
    for step in range(start, s.steps):
        first, second = restated_pairs(sentences, s.batch_size, random.Random(training.step_seed(s.seed, step)))
        batch = masked_batch(tokenizer, first, second, s, training.generator(s.seed, step, 1))
        torch.manual_seed(training.step_seed(s.seed, step, 2))  # dropout, if the config has any
        logits, labels = target_logits(model, batch)
        loss = F.cross_entropy(logits.float(), labels)
        training.check_finite(loss.detach(), step, "pretrain_encoder")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        accuracy = float((logits.detach().argmax(-1) == labels).float().mean())
        history.append({"mlm_loss": float(loss.detach()), "mlm_accuracy": accuracy})
        if log is not None:
            log({**history[-1], "lr": schedule.get_last_lr()[0]}, step)
        done = step + 1
        if done % s.checkpoint_every == 0 or done == s.steps:
            training.save_checkpoint(checkpoint, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                                  "schedule": schedule.state_dict(), "step": done, "history": history}, fp)
        if stop_after is not None and done >= stop_after:
            break
    tenth = max(1, len(history) // 10)
    summary = {}
    for name, part in (("first", history[:tenth]), ("last", history[-tenth:])):
        for key in ("mlm_loss", "mlm_accuracy"):
            summary[f"{name}_{key}"] = sum(h[key] for h in part) / len(part) if part else float("nan")
    return {**summary, "steps": len(history), "seconds": round(time.time() - t0, 1)}
