"""What the mechanism study's representation probe reads (../shared/MECHANISM.md, "Representation probe",
gate C): an encoder's or CLIP tower's state of each object word, and two model-free baselines.

- `neutral_sentences`, `tower_features`, `encoder_features`: each object put into the same neutral
  sentences; per layer, the model's state at the object word averaged over them, (objects, width) float64.
  `probe.loo_correct` reads one layer.
- `context_counts`: the corpus baseline, each object's context-word counts in the language corpus. If
  the corpus said anything of an object's attribute, a probe would read it here without any model.
- `bag_of_words_predictions`: the `vis` task's bag-of-words row, ridge on one-hot labels over the
  sentences' word counts, closed form in numpy. It shows what the task's wording gives away.

No params or paths: the caller passes every value.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from typing import Sequence

import numpy as np

from xdbert.analysis import probe
from xdbert.data.synthetic import words as C


def neutral_sentences(n: int, seed: int = 0) -> list[str]:
    """`n` frames with `{}` for the object: a person, a verb every object takes, a place. No attribute word."""
    common = set(v.base for v in C.VERBS)
    for o in C.OBJECTS + C.EXTRA_OBJECTS:  # the mechanism world's 80 objects take the same verbs as today's 44
        common &= set(v.base for v in C.verbs_for(o))
    verbs = [v for v in C.VERBS if v.base in common]
    rng = random.Random(seed)
    frames = []
    for _ in range(n):
        person, verb, place = rng.choice(C.PERSONS), rng.choice(verbs), rng.choice(C.PLACES)
        frames.append(f"the {person.sing} {verb.past} the {{}} {place.prep} the {place.name} .")
    return frames


def _positions(ids, token: int, word: str, sentences: list[str]):
    """Where `word`'s one token `token` stands in each row of `ids` (S, L) -> (S,): ValueError unless once in each."""
    return _span(ids, [token], word, sentences)[:, 0]


def _stack(per_object: list[list]) -> list[np.ndarray]:
    """Per object, per layer (width,) -> per layer (objects, width)."""
    return [np.stack([o[layer] for o in per_object]) for layer in range(len(per_object[0]))]


def tower_features(tower, tok, objects: list[str], frames: list[str]) -> list[np.ndarray]:
    """Per layer of a CLIP text tower (the input embedding, each residual block, the output after ln_final):
    (objects, width) float64, the state at the object word averaged over `frames` (`{}` for the object).

    `tok` is the tower's CLIP tokenizer (`xdbert.clip.clip_tokenizer`); each object must be one CLIP token
    and occur once in each sentence (else ValueError). The tower is put in eval mode. Its causal mask lets
    the state at the object see the words before it alone, so what follows in a frame does not matter.
    """
    import torch

    tower.eval()
    out = []
    with torch.no_grad():
        for obj in objects:
            pieces = tok.encode(obj)
            if len(pieces) != 1:
                raise ValueError(f"the object {obj!r} is {len(pieces)} CLIP tokens, not one")
            sentences = [f.format(obj) for f in frames]
            ids = tok(sentences)  # (S, 77), [SOT] ... [EOT] 0...
            pos = _positions(ids, pieces[0], obj, sentences)
            n = int((ids != 0).sum(1).max())
            x = tower.token_embedding(ids[:, :n]) + tower.positional_embedding[:n]
            states = [x]
            for block in tower.transformer.resblocks:
                x = block(x, attn_mask=tower.attn_mask[:n, :n])
                states.append(x)
            states.append(tower.ln_final(x))
            rows = torch.arange(len(frames))
            out.append([s[rows, pos].mean(0).double().numpy() for s in states])
    return _stack(out)


def encoder_features(model, tok, objects: list[str], frames: list[str]) -> list[np.ndarray]:
    """Per hidden state of a transformers encoder (the embeddings, each layer): (objects, width) float64,
    the state at the object word averaged over `frames` (`{}` for the object).

    `tok` is the encoder's tokenizer. An object split into word pieces (a small trained vocabulary, as the
    micro profile's) is the mean of its pieces' states, as probing work does; the embedded profile's objects
    are single tokens (a test). No piece may be [UNK], and the object must occur once in each sentence
    (else ValueError). The model is put in eval mode.
    """
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for obj in objects:
            pieces = tok.tokenize(obj)
            if not pieces or tok.unk_token in pieces:
                raise ValueError(f"the object {obj!r} is the tokens {pieces} in the encoder's vocabulary: not known")
            sentences = [f.format(obj) for f in frames]
            batch = tok(sentences, return_tensors="pt", padding=True)
            span = _span(batch["input_ids"], tok.convert_tokens_to_ids(pieces), obj, sentences)
            hidden = model(**batch, output_hidden_states=True).hidden_states
            rows = torch.arange(len(frames))[:, None]
            out.append([h[rows, span].mean(1).mean(0).double().numpy() for h in hidden])
    return _stack(out)


def _span(ids, pieces: list[int], word: str, sentences: list[str]):
    """Where `word`'s pieces stand in each row of `ids` (S, L) -> (S, len(pieces)): ValueError unless once in each."""
    import torch

    k = len(pieces)
    windows = ids.unfold(1, k, 1)                              # (S, L - k + 1, k)
    found = (windows == torch.tensor(pieces)).all(-1)          # (S, L - k + 1)
    for count, sentence in zip(found.sum(1).tolist(), sentences):
        if count != 1:
            what = "a token" if k == 1 else "its tokens"
            raise ValueError(f"the object {word!r} occurs {count} times as {what} in {sentence!r}; the probe needs it once")
    return found.int().argmax(1)[:, None] + torch.arange(k)


def words(sentence: str) -> list[str]:
    """A sentence's words, lowercased, punctuation dropped: what both baselines count."""
    return re.findall(r"\w+", sentence.lower())


def context_counts(sentences: Sequence[str], objects: Sequence, window: int, vocabulary: Sequence[str] | None = None,
                   n_words: int | None = None) -> np.ndarray:
    """Each object's context-word counts in the corpus `sentences`, (objects, words) float64.

    `objects` are nouns (`words.Noun`: `sing`, `plural`); an occurrence is either form. Its context is
    the words within `window` words of it in its sentence, itself left out. The columns are `vocabulary`
    in its order, or where None the context words over all the objects, most frequent first (ties in
    alphabetical order), the first `n_words` of them where given. A cap can hide a leak: a few corpus
    sentences stating facts make the attribute words rare context words, and a probe cannot read a
    column that was cut.

    Raw counts, not log1p-scaled: the probe standardizes each column over the objects, so a leaking
    word's column reads the same whatever its counts' scale, and log1p only reshapes a column within
    itself (on the embedded corpus it moved a planted leak's p both ways and left the clean probe inside its null).
    """
    if window < 1:
        raise ValueError(f"the context window must be at least one word; got {window}")
    row = {}
    for i, o in enumerate(objects):
        for form in (o.sing, o.plural):
            if row.setdefault(form, i) != i:
                raise ValueError(f"{form!r} is a form of two objects")
    per_object = [Counter() for _ in objects]
    for sentence in sentences:
        ws = words(sentence)
        for at, w in enumerate(ws):
            if w in row:
                per_object[row[w]].update(ws[max(0, at - window):at] + ws[at + 1:at + 1 + window])
    if vocabulary is None:
        total = sum(per_object, Counter())
        vocabulary = sorted(total, key=lambda w: (-total[w], w))[:n_words]
    column = {w: j for j, w in enumerate(vocabulary)}
    counts = np.zeros((len(per_object), len(column)))
    for i, c in enumerate(per_object):
        for w, k in c.items():
            if w in column:
                counts[i, column[w]] = k
    return counts


def bag_of_words_predictions(train: Sequence[tuple[str, int]], dev: Sequence[str], n_classes: int,
                             lam: float) -> np.ndarray:
    """The bag-of-words model's dev predictions (dev,) int: ridge on one-hot labels, closed form, float64.

    Features: each sentence's word counts over the train sentences' words (a word only dev sentences
    use has no weight to learn). Features and one-hot labels are centred on the train rows, so the
    intercept is not penalized; the weights solve (X'X + lam I) W = X'Y. A dev sentence gets the class
    of its highest score.
    """
    if lam <= 0:
        raise ValueError(f"the ridge penalty must be above 0; got {lam}")
    if not train:
        raise ValueError("the bag-of-words model needs train rows")
    texts, labels = zip(*train)
    column = {w: j for j, w in enumerate(sorted({w for t in texts for w in words(t)}))}

    def counts(sentences) -> np.ndarray:
        x = np.zeros((len(sentences), len(column)))
        for i, s in enumerate(sentences):
            for w in words(s):
                if w in column:
                    x[i, column[w]] += 1
        return x

    x, y = counts(texts), probe.onehot(np.array(labels), n_classes)
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc = x - x_mean
    weights = np.linalg.solve(xc.T @ xc + lam * np.eye(len(column)), xc.T @ (y - y_mean))
    return ((counts(dev) - x_mean) @ weights + y_mean).argmax(1)
