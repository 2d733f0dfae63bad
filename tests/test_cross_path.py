"""CLIP's information reaches the language side through the cross layers, and `clip_path_cut` cuts it.

A label that only the CLIP input carries (the language input is one sentence for every example) is
learned by the full cross-modal model (the finetuning kind `full`) and stays at chance with the path cut.
This is what gate B of the mechanism study (issue 55) relies on: its FAIL is shown with the same switch.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from xdbert.clip import clip_special_ids
from xdbert.data.tasks.registry import get_task
from xdbert.finetuning.compute.heads import FullModelClassifier, RowSubsetEmbedding
from xdbert.model.modeling import XDBertConfig, XDBertModel, clip_path_cut

SOT, EOT = clip_special_ids("xdbert-tiny")
CLASS_TOKENS = (320, 321)                  # the label's only carrier: one of these among random CLIP tokens
SENTENCE = torch.tensor([2, 5, 6, 7, 3])   # [CLS] three words [SEP], the same for every example
TINY_BERT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
WORDS, STEPS, BATCH = 8, 100, 16


def tiny_model(seed: int = 0) -> XDBertModel:
    torch.manual_seed(seed)
    return XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=dict(TINY_BERT), vocab_size=30,
                                          clip="xdbert-tiny", clip_heads=2, clip_blocks=1, cross_layers=2))


def clip_examples(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n balanced examples: clip_ids (n, 1, 77), [SOT] WORDS random tokens [EOT], one of them replaced by
    the class token at a random place; and the labels (n,)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    clip_ids = torch.zeros(n, 1, 77, dtype=torch.long)
    clip_ids[:, 0, 0], clip_ids[:, 0, WORDS + 1] = SOT, EOT
    clip_ids[:, 0, 1:WORDS + 1] = torch.randint(400, 1400, (n, WORDS), generator=g)
    place = torch.randint(1, WORDS + 1, (n,), generator=g)
    clip_ids[torch.arange(n), 0, place] = torch.tensor(CLASS_TOKENS)[labels]
    return clip_ids, labels


def batch_of(clip_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    n = len(clip_ids)
    return {"input_ids": SENTENCE.expand(n, -1), "attention_mask": torch.ones(n, len(SENTENCE), dtype=torch.long),
            "clip_ids": clip_ids}


def held_out_accuracy(cut: bool, carried: bool = True) -> tuple[float, torch.Tensor]:
    """Train the `full` kind (everything but CLIP's projection) for STEPS batches drawn from 512 examples;
    score 64 others. As in a finetuning job (`job.build_model`), CLIP's embedding keeps only the rows the
    examples use: the other 49,000 would only slow each step. `carried: False` is the twin's world: the
    CLIP input's class token says nothing of the label (the training labels are shuffled)."""
    train_ids, train_labels = clip_examples(512, seed=1)
    dev_ids, dev_labels = clip_examples(64, seed=2)
    if not carried:
        train_labels = train_labels[torch.randperm(len(train_labels), generator=torch.Generator().manual_seed(4))]
    model = FullModelClassifier(tiny_model(), get_task("sst2"), dropout=0.0)
    tower = model.xd.clip
    tower.token_embedding = RowSubsetEmbedding(tower.token_embedding, torch.cat([train_ids, dev_ids]).unique().numpy())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    order = torch.Generator().manual_seed(3)
    with clip_path_cut(model) if cut else contextlib.nullcontext():
        model.train()
        for _ in range(STEPS):
            rows = torch.randperm(len(train_ids), generator=order)[:BATCH]
            loss = F.cross_entropy(model(batch_of(train_ids[rows])), train_labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            predictions = model(batch_of(dev_ids)).argmax(-1)
    return (predictions == dev_labels).float().mean().item(), predictions


@pytest.fixture(scope="module")
def trained() -> dict[bool, tuple[float, torch.Tensor]]:
    return {cut: held_out_accuracy(cut) for cut in (False, True)}


def test_gate_b_passes_through_the_path_and_fails_with_it_cut(trained):
    """Gate B of the mechanism study on this tiny world: the full model whose CLIP input carries the label
    ("XDBERT") against one trained where it does not ("nofacts"). With CLIP's keys and values zeroed in the
    cross layers of both, the same comparison prints FAIL."""
    from xdbert.analysis.mechanism_stats import gate_b, paired_difference

    _, dev_labels = clip_examples(64, seed=2)
    correct = {(cut, carried): (held_out_accuracy(cut, carried)[1] if not carried else trained[cut][1]) == dev_labels
               for cut in (False, True) for carried in (True, False)}
    settings = dict(objects=None, kinds=None, kind=None, n_boot=500, level=0.95, exact_below=20, seed=0)
    verdicts = {}
    for cut in (False, True):
        difference = paired_difference(correct[cut, True][None].numpy(), correct[cut, False][None].numpy(), **settings)
        verdicts[cut] = gate_b(difference)
    assert verdicts[False].passed and "full XDBERT - full nofacts on F+ = +" in verdicts[False].text
    assert verdicts[True].state == "FAIL" and verdicts[True].interval.estimate == 0.0


def test_a_label_only_clip_carries_is_learned_through_the_cross_layers(trained):
    accuracy, _ = trained[False]
    assert accuracy >= 0.85, f"held-out accuracy {accuracy:.3f}; chance is 0.5"


def test_with_the_path_cut_the_same_training_stays_at_chance(trained):
    accuracy, predictions = trained[True]
    assert len(set(predictions.tolist())) == 1  # one language input, blind to CLIP: one answer for all
    assert accuracy == 0.5


def test_cut_language_outputs_do_not_depend_on_the_clip_input():
    model = tiny_model().eval()
    a, _ = clip_examples(4, seed=5)
    b, _ = clip_examples(4, seed=6)
    b[:, 0, WORDS - 2:] = 0                # other tokens and shorter: another mask and layout too
    b[:, 0, WORDS - 2] = EOT
    inputs = (SENTENCE.expand(4, -1), torch.ones(4, len(SENTENCE), dtype=torch.long))
    with torch.no_grad():
        uncut = [model.encode(*inputs, clip)[0] for clip in (a, b)]
        with clip_path_cut(model):
            cut = [model.encode(*inputs, clip)[0] for clip in (a, b)]
    assert not torch.equal(*uncut)
    assert torch.equal(*cut)


def test_without_the_cut_outputs_are_bit_identical():
    """A forward before any hook was installed, and one after the context exits, give the same bits."""
    model = tiny_model().eval()
    clip_ids, _ = clip_examples(4, seed=5)
    inputs = (SENTENCE.expand(4, -1), torch.ones(4, len(SENTENCE), dtype=torch.long), clip_ids)
    with torch.no_grad():
        before = model.encode(*inputs)
        with clip_path_cut(model) as same:
            assert same is model
            during = model.encode(*inputs)
        after = model.encode(*inputs)
    assert not torch.equal(during[0], before[0])
    for x, y in zip(before, after):
        assert torch.equal(x, y)
    assert not any(m._forward_hooks for m in model.modules())


def test_a_model_without_cross_layers_has_no_path_to_cut():
    torch.manual_seed(0)
    baseline = XDBertModel.build(XDBertConfig(encoder="random:bert", encoder_config=dict(TINY_BERT), vocab_size=30,
                                              cross_layers=0, losses=["mlm"]))
    with pytest.raises(ValueError, match="no cross-modal layers"), clip_path_cut(baseline):
        pass
