"""The embedded profile's stand-ins for a pretrained language encoder and a pretrained CLIP text tower.

The paper adapts BERT/ELECTRA as released: encoders whose attention already lines up matching words of
two texts, which QNLI, QQP and MATCH all need. A random-init encoder has no such heads, and a few hundred
finetuning steps do not grow them (QNLI and QQP stayed at 52-55% without this stage). So a random encoder
is first trained with MLM on pairs of corpus sentences: the second sentence restates the first (its
words rotated half of the time, so a fixed offset cannot copy) and is masked far more, so its targets
are found by looking up the same words in the first sentence.

Hub encoders (the paper profile) are used as downloaded: `xdbert.model.build.encoder_source` returns
their name unchanged and no stand-in is trained for them. Likewise a random CLIP tower is first trained as
a causal language model on the corpus (`pretrain_clip`), while pretrained CLIP weights are used as downloaded.
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from xdbert import io, training
from xdbert.adaptation import masking
from xdbert.adaptation.pretrain_settings import PretrainSettings
from xdbert.data.tokenization.saving import save_tokenizer
from xdbert.clip import clip_block_mask
from xdbert.data.tokenization.windows import CLIP_CONTEXT
from xdbert.errors import PipelineError
from xdbert.model import IGNORE_INDEX

# The modules of each family's `...ForMaskedLM` that turn hidden states into vocabulary logits, in order.
# They act on each position alone, so they can run on the target rows only: the vocabulary-wide decoder at
# every position is half of each pretraining step (a 4,000-word vocabulary against a 64-wide encoder).
MLM_HEAD_MODULES = {
    "bert": ("cls",),
    "roberta": ("lm_head",),
    "xlm-roberta": ("lm_head",),
    "electra": ("generator_predictions", "generator_lm_head"),
}


def split_sentences(texts: list[str], min_words: int = 4) -> list[str]:
    """Sentences of the corpus documents (split after . ! ?), the short ones dropped."""
    out = []
    for text in texts:
        out.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= min_words)
    return out


def corpus_sentences(corpus_dir: str | Path) -> list[str]:
    """The sentences of the corpus's train documents, what the encoder's stand-in learns from."""
    table = io.read_parquet(Path(corpus_dir) / "train.parquet", "rerun `dvc repro corpus`")
    return split_sentences(table.column("text").to_pylist())


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
    labels = torch.where(labels_a != IGNORE_INDEX, labels_a, labels_b)
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
    targets = labels != IGNORE_INDEX
    heads = MLM_HEAD_MODULES.get(model.config.model_type)
    if heads is None:
        return model(**inputs).logits[targets], labels[targets]
    hidden = model.base_model(**inputs).last_hidden_state[targets]
    for name in heads:
        hidden = getattr(model, name)(hidden)
    return hidden, labels[targets]


def pretrain(model: torch.nn.Module, tokenizer, sentences: list[str], s: PretrainSettings, checkpoint: Path,
             stop_after: int | None = None) -> dict:
    """Train a transformers `...ForMaskedLM` for `s.steps` steps; resume from `checkpoint` when it matches.

    Each step's pairs and masking are drawn from (seed, step), so a resumed run takes the same steps.
    Returns the mean loss and target accuracy of the first and last 10% of the steps.
    """
    def step_loss(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = restated_pairs(sentences, s.batch_size, random.Random(training.step_seed(s.seed, step)))
        batch = masked_batch(tokenizer, first, second, s, training.generator(s.seed, step, 1))
        return target_logits(model, batch)

    return _train(model, s, "mlm", step_loss, len(sentences), checkpoint, stop_after)


def save_masked_lm(mlm: torch.nn.Module, tokenizer, directory: str | Path) -> None:
    """The trained stand-in and its tokenizer as one `save_pretrained` folder, written atomically: the
    `pretrain_encoder@<family>` stage's output."""
    with io.atomic_path(directory, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        mlm.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)


def shard_blocks(split) -> torch.Tensor:
    """The CLIP blocks (N, 77) of every window of a token-shard split, what the CLIP tower's stand-in learns from."""
    return torch.from_numpy(split.column("clip_ids").astype(np.int64)).view(-1, CLIP_CONTEXT)


def caption_mix(caption_blocks: torch.Tensor, corpus_blocks: torch.Tensor, caption_share: float) -> torch.Tensor:
    """The mechanism study's training blocks for the CLIP stand-in: every caption block, then corpus blocks in
    order (wrapping round) so that captions are `caption_share` of the whole. The tower must still read corpus
    text: beside a tower that cannot, MATCH stays at chance."""
    from xdbert.data.caption_mix import corpus_rows

    return torch.cat([caption_blocks, corpus_blocks[torch.from_numpy(corpus_rows(len(caption_blocks), len(corpus_blocks),
                                                                                 caption_share))]])


def pretrain_clip(tower: torch.nn.Module, blocks: torch.Tensor, eot_id: int, s: PretrainSettings, checkpoint: Path,
                  stop_after: int | None = None) -> dict:
    """Train a random CLIP text tower as a causal language model on CLIP blocks (N, 77) for `s.steps` steps.

    The embedded profile's stand-in for CLIP's pretraining (it has no images): its text tower is causal, so
    predicting each next token is the objective it can learn from text alone. MATCH needs it: beside a
    random tower the cross layers never learned to compare the two texts (README). The decoder is tied
    to the token embedding and scores only the ids that occur in `blocks`: the other ~45,000 of CLIP's
    49,408 are never a target, and decoding them at every position would be most of each step.
    Returns the mean loss and next-token accuracy of the first and last 10% of the steps.
    """
    if blocks.ndim != 2 or blocks.shape[1] != CLIP_CONTEXT or len(blocks) == 0:
        raise PipelineError(f"CLIP pretraining needs blocks of shape (N, {CLIP_CONTEXT}) with N > 0; got {tuple(blocks.shape)}")
    mask = clip_block_mask(blocks[:, None], eot_id)[:, 0]
    blocks, mask = blocks[mask.sum(1) > 2], mask[mask.sum(1) > 2]  # a block with text: [SOT] w... [EOT]
    vocab = torch.unique(blocks[mask.bool()])
    to_class = torch.full((int(vocab.max()) + 1,), IGNORE_INDEX, dtype=torch.long)
    to_class[vocab] = torch.arange(len(vocab))

    def step_loss(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randint(len(blocks), (s.batch_size,), generator=training.generator(s.seed, step))
        ids, valid = blocks[rows], mask[rows]
        hidden = tower(ids[:, None], valid[:, None])  # (B, 77, W), zero after [EOT]
        follows = valid[:, 1:].bool()  # position t predicts the real token at t + 1
        logits = hidden[:, :-1][follows] @ tower.token_embedding.weight[vocab].T
        return logits, to_class[ids[:, 1:][follows]]

    return _train(tower, s, "lm", step_loss, len(blocks), checkpoint, stop_after)


def _train(model: torch.nn.Module, s: PretrainSettings, name: str,
           step_loss: Callable[[int], tuple[torch.Tensor, torch.Tensor]], data_size: int, checkpoint: Path,
           stop_after: int | None) -> dict:
    """The step loop both stand-ins share: AdamW with warmup and decay, checkpoints, resume, a summary.

    `step_loss(step)` gives (logits at the targets, their classes) from data drawn by (seed, step) alone,
    so a resumed run takes the same steps as an uninterrupted one.
    """
    optimizer, schedule = training.optimizer_and_schedule(model, s.lr, s.weight_decay, s.warmup_ratio, s.steps)
    fp = training.fingerprint(asdict(s), name, data_size, *training.model_identity(model))
    checkpoints = training.Checkpoints(checkpoint, fp, {"model": model, "optimizer": optimizer, "schedule": schedule},
                                       s.checkpoint_every, s.steps, stop_after)
    state = checkpoints.resume()
    start, history = (state["step"], state["history"]) if state else (0, [])
    model.train()
    t0 = time.time()
    # minutes of steps on a CPU: a line every 10 s keeps a `dvc repro` log alive without flooding it
    for step in tqdm(range(start, s.steps), initial=start, total=s.steps, desc=f"pretrain ({name})", mininterval=10):
        torch.manual_seed(training.step_seed(s.seed, step, 2))  # dropout, if the config has any
        logits, labels = step_loss(step)
        loss = F.cross_entropy(logits.float(), labels)
        training.check_finite(loss.detach(), step, f"pretraining ({name})")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        accuracy = float((logits.detach().argmax(-1) == labels).float().mean())
        history.append({f"{name}_loss": float(loss.detach()), f"{name}_accuracy": accuracy})
        if checkpoints.step_done(step + 1, history=history):
            break
    tenth = max(1, len(history) // 10)
    summary = {}
    for part_name, part in (("first", history[:tenth]), ("last", history[-tenth:])):
        for key in (f"{name}_loss", f"{name}_accuracy"):
            summary[f"{part_name}_{key}"] = sum(h[key] for h in part) / len(part)
    return {**summary, "steps": len(history), "seconds": round(time.time() - t0, 1)}
