"""The representation probe's features and gate C's baselines (xdbert/analysis/representations.py), on
tiny random models and hand-made corpora."""
import random

import numpy as np
import pytest
import torch

from xdbert.analysis.representations import (
    bag_of_words_predictions, context_counts, encoder_features, neutral_sentences, tower_features,
)
from tiny_bert import tiny_bert
from xdbert.data.synthetic.words import Noun

pytestmark = pytest.mark.usefixtures("one_thread")

OBJECTS = ["kite", "ball", "cup"]


@pytest.fixture(scope="module")
def clip():
    """A tiny random CLIP tower and CLIP's tokenizer."""
    from xdbert.clip import clip_tokenizer
    from xdbert.model.clip_tower import CLIPTextTower

    torch.manual_seed(0)
    return CLIPTextTower.build("xdbert-tiny"), clip_tokenizer("xdbert-tiny")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny random BertModel and a WordPiece tokenizer trained on the neutral sentences, loaded back the
    way the pipeline loads models/tokenizer (AutoTokenizer: the fast tokenizer)."""
    texts = [f.format(o) for f in neutral_sentences(20) for o in OBJECTS] * 5
    return tiny_bert(tmp_path_factory.mktemp("wordpiece"), texts, 200)


def test_neutral_sentences_hold_one_object_slot_and_no_attribute():
    from xdbert.data.synthetic.words import PATTERNS

    frames = neutral_sentences(20)
    assert len(frames) == 20 and frames == neutral_sentences(20) and frames != neutral_sentences(20, seed=1)
    assert all(f.count("{}") == 1 and not set(f.split()) & set(PATTERNS) for f in frames)


def test_tower_features_per_layer(clip):
    tower, tok = clip
    features = tower_features(tower, tok, OBJECTS, neutral_sentences(4))
    assert len(features) == len(tower.transformer.resblocks) + 2  # the input embedding, each block, ln_final
    assert all(f.shape == (len(OBJECTS), tower.width) and f.dtype == np.float64 for f in features)
    # the input embedding averaged over sentences that all put the object at the same place: its token's
    # embedding plus that place's position embedding
    (kite,) = tok.encode("kite")
    at = tok(["the teacher saw the kite ."])[0].tolist().index(kite)
    expected = tower.token_embedding.weight[kite] + tower.positional_embedding[at]
    np.testing.assert_allclose(tower_features(tower, tok, ["kite"], ["the teacher saw the {} ."])[0][0],
                               expected.detach().double().numpy(), rtol=1e-6)


def test_the_causal_tower_ignores_the_words_after_the_object(clip):
    tower, tok = clip
    before = tower_features(tower, tok, OBJECTS, ["the man saw the {} in the park .", "a {} on the hill"])
    after = tower_features(tower, tok, OBJECTS, ["the man saw the {} and went home later that day !", "a {} ."])
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)  # the sentences' lengths differ: the sums' order may too
    other = tower_features(tower, tok, OBJECTS, ["the woman saw the {} in the park .", "a {} on the hill"])
    assert not np.allclose(before[-1], other[-1], atol=1e-3)  # what comes before the object does count


def test_encoder_features_per_hidden_state(bert):
    model, tok = bert
    features = encoder_features(model, tok, OBJECTS, neutral_sentences(4))
    assert len(features) == model.config.num_hidden_layers + 1  # the embeddings, each layer
    assert all(f.shape == (len(OBJECTS), model.config.hidden_size) and f.dtype == np.float64 for f in features)
    assert not model.training
    # each object's own row: the features of one object alone are its row among several
    np.testing.assert_allclose(encoder_features(model, tok, ["ball"], neutral_sentences(4))[-1][0], features[-1][1],
                               rtol=1e-5, atol=1e-6)


def test_an_object_that_is_not_one_token_or_not_once_in_a_sentence(clip, bert):
    tower, ctok = clip
    model, btok = bert
    with pytest.raises(ValueError, match="'zigzag' is 2 CLIP tokens"):
        tower_features(tower, ctok, ["kite", "zigzag"], neutral_sentences(2))
    assert btok.tokenize("zebra") == ["[UNK]"]
    with pytest.raises(ValueError, match="'zebra' is the tokens \\['\\[UNK\\]'\\] in the encoder's vocabulary: not known"):
        encoder_features(model, btok, ["zebra"], neutral_sentences(2))
    frames = ["the man saw the {} in the park .", "the {0} and the {0} ."]
    for run, (m, t) in ((tower_features, clip), (encoder_features, bert)):
        with pytest.raises(ValueError, match="'kite' occurs 2 times as a token in 'the kite and the kite .'"):
            run(m, t, ["kite"], frames)


def test_an_object_of_several_word_pieces_is_the_mean_of_their_states(bert):
    """A small trained vocabulary (the micro profile's) splits some objects: the probe reads their pieces' mean."""
    import torch

    model, btok = bert
    pieces = btok.tokenize("balloon")
    assert len(pieces) > 1 and pieces[0] == "ball"
    frames = neutral_sentences(3)
    got = encoder_features(model, btok, ["balloon"], frames)
    batch = btok([f.format("balloon") for f in frames], return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
    wanted, k = btok.convert_tokens_to_ids(pieces), len(pieces)
    starts = [next(i for i in range(len(row)) if row[i:i + k] == wanted) for row in batch["input_ids"].tolist()]
    for layer, h in enumerate(hidden):
        want = torch.stack([h[row, start:start + k].mean(0) for row, start in enumerate(starts)]).mean(0)
        np.testing.assert_allclose(got[layer][0], want.double().numpy(), rtol=1e-5, atol=1e-6)


def test_context_counts_on_a_hand_made_corpus():
    kite, ball = Noun("kite", "kites"), Noun("ball", "balls")
    corpus = ["The boy flew the red kite in the park.",
              "Two kites and a ball!",
              "She threw the ball, the ball fell."]
    # kite: "the red" + "in the", "two" + "and a"; ball: "and a", "threw the" + "the ball", "ball the" + "fell"
    counts = context_counts(corpus, [kite, ball], 2, vocabulary=["the", "red", "and", "a", "fell", "park"])
    np.testing.assert_array_equal(counts, [[2, 1, 1, 1, 0, 0],
                                           [3, 0, 1, 1, 1, 0]])
    assert counts.dtype == np.float64
    # the default vocabulary: every context word, most frequent first, ties in alphabetical order
    window_1 = context_counts(corpus, [kite, ball], 1)  # kite: red, in, two, and; ball: a, the, the, the, fell
    np.testing.assert_array_equal(window_1, [[0, 0, 1, 0, 1, 1, 1],    # the, a, and, fell, in, red, two
                                             [3, 1, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(context_counts(corpus, [kite, ball], 1, n_words=2), window_1[:, :2])
    with pytest.raises(ValueError, match="'balls' is a form of two objects"):
        context_counts(corpus, [ball, Noun("sphere", "balls")], 1)


def toy_rows(n: int, rng: random.Random) -> list[tuple[str, int]]:
    """Sentences of filler words and one label word: the label is which label word it holds."""
    filler, label_words = ["the", "man", "saw", "a", "park", "on", "hill", "dog"], ["red", "blue", "green", "gold"]
    rows = []
    for _ in range(n):
        label = rng.randrange(4)
        text = rng.sample(filler, 4)
        text.insert(rng.randrange(5), label_words[label])
        rows.append((" ".join(text) + ".", label))
    return rows


def test_bag_of_words_learns_a_word_determined_label_and_not_a_shuffled_one():
    rng = random.Random(0)
    train, dev = toy_rows(200, rng), toy_rows(400, rng)
    texts, labels = [t for t, _ in dev], np.array([y for _, y in dev])
    predictions = bag_of_words_predictions(train, texts, 4, 1.0)
    assert predictions.shape == (400,) and (predictions == labels).mean() == 1.0
    # the labels shuffled over all the sentences, train and dev: no word tells them any more
    shuffled = [y for _, y in train + dev]
    rng.shuffle(shuffled)
    chance = bag_of_words_predictions(list(zip([t for t, _ in train], shuffled)), texts, 4, 1.0)
    assert abs((chance == np.array(shuffled[len(train):])).mean() - 0.25) < 0.07  # 3 standard errors of 400 guesses
    with pytest.raises(ValueError, match="ridge penalty"):
        bag_of_words_predictions(train, texts, 4, 0.0)
