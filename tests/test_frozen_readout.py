"""The frozen readout beside `vis` (xdbert/analysis/frozen_readout.py), on a tiny random BERT and hand-made
sentences."""
import random

import numpy as np
import pytest

from xdbert.analysis import frozen_readout as F
from tiny_bert import tiny_bert
from xdbert.data.synthetic.words import Noun

pytestmark = pytest.mark.usefixtures("one_thread")

OBJECTS = [Noun(s, s + "s") for s in ("kite", "ball", "cup", "lamp", "drum", "boat", "vase", "sock")]
ATTRIBUTES = ["striped", "spotted", "plaid", "floral"]
PEOPLE = ["man", "woman", "teacher", "king"]
PLACES = ["park", "garden", "square", "market"]


def sentence(rng: random.Random, obj: Noun, attr: str) -> str:
    """A hand-made vis-like sentence: the attribute stated just before the object, singular or plural."""
    noun = obj.sing if rng.random() < 0.5 else f"two {obj.plural}"
    return f"the {rng.choice(PEOPLE)} saw the {attr} {noun} in the {rng.choice(PLACES)} ."


def rows(n: int, seed: int) -> list[tuple[str, int]]:
    """`n` sentences, each labelled with its object's fact (the object's place in OBJECTS mod 4), as vis's F
    rows are; the stated attribute is drawn apart from it, so it says nothing of the label."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        i = rng.randrange(len(OBJECTS))
        out.append((sentence(rng, OBJECTS[i], rng.choice(ATTRIBUTES)), i % len(ATTRIBUTES)))
    return out


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny random BertModel and a WordPiece tokenizer trained on the sentences, loaded back the way the
    pipeline loads models/tokenizer (AutoTokenizer: the fast tokenizer)."""
    return tiny_bert(tmp_path_factory.mktemp("wordpiece"), [t for t, _ in rows(400, 9)], 100)  # small: plurals in pieces


def test_object_word_is_the_one_object_form_of_the_sentence():
    assert F.object_word("The man saw the kite in the park.", OBJECTS) == "kite"
    assert F.object_word("the man saw two kites .", OBJECTS) == "kites"
    with pytest.raises(ValueError, match="'the man saw the tree .' names 0 objects"):
        F.object_word("the man saw the tree .", OBJECTS)
    with pytest.raises(ValueError, match=r"names 2 objects \(\['kite', 'cup'\]\)"):
        F.object_word("the man saw the kite and the cup .", OBJECTS)


def test_states_are_the_last_layer_at_the_word_the_mean_of_its_pieces(bert):
    model, tok = bert
    texts = [t for t, _ in rows(300, 1)]  # more than one batch of F.BATCH
    at = [F.object_word(t, OBJECTS) for t in texts]
    x = F.last_layer_states(model, tok, texts, at)
    assert x.shape == (300, 32) and x.dtype == np.float64
    pieces_of = lambda w: tok.convert_tokens_to_ids(tok.tokenize(w))  # noqa: E731
    split = next(i for i in range(F.BATCH, 300) if len(pieces_of(at[i])) > 1)  # a word in pieces, in the second batch
    # a sentence alone, no padding beside it, reads the same state (within float32 kernels' rounding)
    for i in (0, split, 299):
        ids = tok(texts[i], return_tensors="pt")
        last = model(**ids).last_hidden_state[0].double().detach().numpy()
        pieces = pieces_of(at[i])
        start = ids["input_ids"][0].tolist().index(pieces[0])
        np.testing.assert_allclose(x[i], last[start:start + len(pieces)].mean(0), atol=1e-5)
        if i == split:  # the mean of its pieces, not the first alone
            assert not np.allclose(x[i], last[start], atol=1e-3)


def test_a_word_missing_or_twice_in_its_sentence_raises_naming_it(bert):
    model, tok = bert
    with pytest.raises(ValueError, match="'kite' occurs 0 times"):
        F.last_layer_states(model, tok, ["the man saw the cup .", "the man saw the kite ."], ["cup", "kite"][::-1])
    with pytest.raises(ValueError, match="'kite' occurs 2 times"):
        F.last_layer_states(model, tok, ["the kite saw the kite ."], ["kite"])
    with pytest.raises(ValueError, match="'zebra' is the tokens"):
        F.last_layer_states(model, tok, ["the man saw the zebra ."], ["zebra"])


def test_the_readout_learns_a_label_the_features_carry_on_held_out_rows():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 16))
    y = rng.integers(0, 4, size=600)
    x = means[y] + rng.normal(size=(600, 16))
    right = F.readout_correct(x[:400], y[:400], x[400:], y[400:])
    assert right.shape == (1, 200) and right.dtype == bool
    assert right.mean() > 0.8
    # the same readout on labels the features do not carry is at chance
    shuffled = rng.permutation(y)
    assert F.readout_correct(x[:400], shuffled[:400], x[400:], shuffled[400:]).mean() < 0.4


def test_the_frozen_readout_reads_the_object_s_label_in_held_out_sentences(bert):
    model, tok = bert
    train, dev = rows(400, 2), rows(200, 3)
    right = F.frozen_readout(model, tok, train, dev, OBJECTS)
    assert right.shape == (1, 200)
    assert right.mean() > 0.8  # chance 0.25: the object word's state names the object, whose label it is
    # the same sentences with labels drawn apart from the objects: nothing to read
    rng = random.Random(4)
    blind = [(t, rng.randrange(4)) for t, _ in train], [(t, rng.randrange(4)) for t, _ in dev]
    assert F.frozen_readout(model, tok, *blind, OBJECTS).mean() < 0.4


def test_two_calls_give_the_same_answers(bert):
    model, tok = bert
    train, dev = rows(200, 5), rows(100, 6)
    np.testing.assert_array_equal(F.frozen_readout(model, tok, train, dev, OBJECTS),
                                  F.frozen_readout(model, tok, train, dev, OBJECTS))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_readout_that_does_not_converge_raises(monkeypatch):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(100, 8)), rng.integers(0, 4, size=100)
    monkeypatch.setattr(F, "MAX_ITER", 2)
    with pytest.raises(ValueError, match="did not converge in 2 lbfgs iterations"):
        F.readout_correct(x, y, x, y)
