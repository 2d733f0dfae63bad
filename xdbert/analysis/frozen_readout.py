"""The frozen readout beside `vis` (issue 68, item 4; ../shared/MECHANISM.md, "Calibration"): what an encoder holds
of the facts with no finetuning to hide or create it.

A multinomial logistic regression on one fixed state of each `vis` sentence, trained on the train objects'
sentences, scored on the dev sentences (the study reads F+). The encoder's weights never move, so a gain over the
baseline is in the encoder itself, and a null is not finetuning washing a fact out.

The position, fixed on seed 100 and committed (never chosen after the fact): the last layer's state at the object
word, the mean over its word pieces. That word is what the fact is about, where the representation probe reads and
where Allen-Zhu and Li's linear probe reads a person's facts (at the name); [CLS] is what finetuning reads, but an
MLM-pretrained encoder never trains [CLS] to gather anything, so a frozen readout there would show what the
finetuning adds, not what the encoder holds. The last layer: what the cross layers and the finetuning head read.

- `object_word`: the one object noun (singular or plural, as written) of a `vis` sentence.
- `last_layer_states`: the last layer's state at a given word of each sentence, (sentences, width) float64.
- `readout_correct`: the logistic regression, fitted on train features, scored on dev features.
- `frozen_readout`: the three together on an encoder and the `vis` rows.

No params or paths: the caller passes every value.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from xdbert.analysis.representations import _span, words
from xdbert.data.synthetic.words import Noun

# The readout's inverse L2 penalty on standardized features, fixed before any run (sklearn's default, no grid): it
# keeps the weights finite where the train objects are separable (40 objects in 64 dimensions always are) and is
# weak beside 800 rows' loss, so the readout is limited by what the states hold, not by the penalty.
C = 1.0
POSITION = "the object word's last-layer state (the mean over its word pieces)"  # the one position, named in the report
TOL = 1e-8          # lbfgs stops far nearer the one optimum of this strictly convex loss than sklearn's default
MAX_ITER = 10_000   # far above the few hundred iterations the embedded encoders need; reaching it raises
BATCH = 256         # sentences per forward pass


def object_word(sentence: str, objects: Sequence[Noun]) -> str:
    """The form (singular or plural) of the one object of `objects` that `sentence` names: ValueError naming the
    sentence where it names none or several. A `vis` sentence names its object once (world._sentence)."""
    forms = {f for o in objects for f in (o.sing, o.plural)}
    found = [w for w in words(sentence) if w in forms]
    if len(found) != 1:
        raise ValueError(f"the vis sentence {sentence!r} names {len(found)} objects ({found}); the readout needs one")
    return found[0]


def last_layer_states(model, tok, sentences: Sequence[str], at: Sequence[str]) -> np.ndarray:
    """(sentences, width) float64: the model's last hidden state at the word `at[i]` in `sentences[i]`, the mean of
    its word pieces' states. A word that is not known to `tok` ([UNK]) or not once in its sentence's tokens raises
    ValueError naming it. The model is put in eval mode."""
    import torch

    if len(sentences) != len(at):
        raise ValueError(f"{len(sentences)} sentences but {len(at)} words to read them at")
    model.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), BATCH):
            texts, targets = list(sentences[start:start + BATCH]), at[start:start + BATCH]
            batch = tok(texts, return_tensors="pt", padding=True)
            last = model(**batch).last_hidden_state
            for row, (text, word) in enumerate(zip(texts, targets)):
                pieces = tok.tokenize(word)
                if not pieces or tok.unk_token in pieces:
                    raise ValueError(f"the word {word!r} is the tokens {pieces} in the encoder's vocabulary: not known")
                span = _span(batch["input_ids"][row:row + 1], tok.convert_tokens_to_ids(pieces), word, [text])[0]
                out.append(last[row, span].mean(0).double().numpy())
    return np.stack(out)


def readout_correct(train_x: np.ndarray, train_y: np.ndarray, dev_x: np.ndarray, dev_y: np.ndarray) -> np.ndarray:
    """(1, dev) bool: whether the readout fitted on (train_x, train_y) gets each dev row's label, the shape of one
    seed's row of `mechanism.correct_matrix`, so `mechanism.difference` pairs it with another encoder's.

    Features standardized on the train rows; a multinomial logistic regression, lbfgs, fixed C. Only the argmax's
    correctness leaves here, never a probability, so the study writes the same bytes on CPUs whose last bits differ.
    A fit that does not converge raises ValueError: where it stopped would depend on the path, not the data alone.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    readout = make_pipeline(StandardScaler(), LogisticRegression(C=C, tol=TOL, max_iter=MAX_ITER))
    with threadpool_limits(1):  # (800, 64) products: a second BLAS thread only waits, and on a busy machine spins
        readout.fit(train_x, train_y)
    iterations = int(readout[-1].n_iter_.max())
    if iterations >= MAX_ITER:
        raise ValueError(f"the frozen readout did not converge in {MAX_ITER} lbfgs iterations")
    return (readout.predict(dev_x) == dev_y)[None, :]


def frozen_readout(model, tok, train: Sequence[tuple[str, int]], dev: Sequence[tuple[str, int]],
                   objects: Sequence[Noun]) -> np.ndarray:
    """(1, dev) bool: the frozen readout of `model` (a transformers encoder; `tok` its tokenizer) on `vis`, trained
    on the (sentence, label) rows `train`, scored on `dev` in its order. Each sentence is read at its one object
    word of `objects` (`object_word`)."""
    texts = [t for t, _ in train] + [t for t, _ in dev]
    x = last_layer_states(model, tok, texts, [object_word(t, objects) for t in texts])
    train_y, dev_y = np.array([y for _, y in train]), np.array([y for _, y in dev])
    return readout_correct(x[:len(train)], train_y, x[len(train):], dev_y)
