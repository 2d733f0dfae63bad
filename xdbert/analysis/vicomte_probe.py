"""The visual-knowledge probes of issue 56 (../shared/PROBES.md): ViComTe's linear probe and zero-shot cloze
(the lines they are compared with, CoDa's correlations and the bootstrap: xdbert.analysis.probe_stats).

The protocol follows the authors' scripts (github ChenyuHeidiZhang/VL-commonsense @ f111efc), read, not
copied: `probing/eval_classification.py` (linear probe), `probing/eval_zero_shot.py` (cloze) and
`probing/models.py` (their loaders). What each function keeps of them is said where it is done.

Classes are indices into the relation's class list, in the order of the distributions file (their
`WORD_LISTS`, alphabetical); `dist` rows are the Visual Genome counts in that order. A per-subject result
is an array with NaN where the protocol leaves the subject out (a class unseen in training, a constant
distribution), so that two rows on the same subjects are paired item by item.

No params or paths: the caller passes every value. Numpy, scipy and scikit-learn; torch only inside the
functions that run a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import scipy.stats
from scipy.special import logsumexp

# eval_classification.py: LogisticRegression(random_state=0, C=0.316, max_iter=2000)
PROBE_C = 0.316
PROBE_MAX_ITER = 2000
PROBE_SEED = 0
METRICS = ("accuracy", "spearman")
CHOICES = ("oracle", "chosen")  # the best template on test; the best in cross-validation on train


# ----------------------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------------------

def mean_pool(hidden, mask) -> np.ndarray:
    """The mean over a text's tokens of the last hidden layer: hidden (n, L, d), mask (n, L) 1 at tokens
    -> (n, d) float64. With [CLS] and [SEP] included, as eval_classification.py averages
    `model.encoder(...)[0]` over every position of one unpadded text."""
    h = np.asarray(hidden, dtype=np.float64)
    m = np.asarray(mask, dtype=np.float64)
    if h.ndim != 3 or m.shape != h.shape[:2]:
        raise ValueError(f"mean_pool needs hidden (n, L, d) and mask (n, L); got {h.shape} and {m.shape}")
    counts = m.sum(1, keepdims=True)
    if (counts == 0).any():
        raise ValueError("a text has no token in the mask")
    return (h * m[..., None]).sum(1) / counts


def _device(model):
    return next(model.parameters()).device


def _chunks(model, texts: Sequence[str], batch_size: int):
    """`model` in eval mode, then `texts` in lists of `batch_size`: the loop of every function here that runs
    a model."""
    if batch_size < 1:
        raise ValueError(f"the batch size must be at least 1; got {batch_size}")
    model.eval()
    for start in range(0, len(texts), batch_size):
        yield list(texts[start:start + batch_size])


def mean_token_features(model, tokenizer, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """ViComTe's features of a transformers encoder (`AutoModel`): per text the mean over its tokens of
    `last_hidden_state` (`mean_pool`), (texts, width) float64. Batches of `batch_size` padded texts; the
    attention mask keeps padding out of both the attention and the mean. The model is put in eval mode."""
    import torch

    out = []
    with torch.no_grad():
        for chunk in _chunks(model, texts, batch_size):
            batch = tokenizer(chunk, padding=True, return_tensors="pt")
            batch = {k: v.to(_device(model)) for k, v in batch.items()}
            hidden = model(**batch).last_hidden_state
            out.append(mean_pool(hidden.float().cpu().numpy(), batch["attention_mask"].cpu().numpy()))
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size))


def clip_text_features(tower, tokenizer, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """CLIP-T's text features, what open_clip's `encode_text` (and OpenAI's, which the authors called)
    returns: the state after ln_final at the [EOT] token, times the text projection; not normalized.
    (texts, embed_dim) float64. `tower` is an `xdbert.model.clip_tower.CLIPTextTower`, `tokenizer` its
    CLIP tokenizer (`xdbert.clip.clip_tokenizer`). The tower is put in eval mode."""
    import torch

    from xdbert.clip import clip_block_mask

    device = _device(tower)
    out = []
    with torch.no_grad():
        for chunk in _chunks(tower, texts, batch_size):
            ids = tokenizer(chunk).to(device)                                   # (B, 77): [SOT] ... [EOT] 0 ...
            mask = clip_block_mask(ids, tokenizer.eot_token_id)
            states = tower(ids[:, None], mask[:, None])                        # (B, 77, width), one block each
            eot = mask.sum(1) - 1                                              # the first [EOT] ends the text
            x = states[torch.arange(len(ids), device=device), eot]
            proj = tower.text_projection
            x = x @ proj if isinstance(proj, torch.nn.Parameter) else proj(x)
            out.append(x.double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


# ----------------------------------------------------------------------------------------------------
# Texts
# ----------------------------------------------------------------------------------------------------

def fill(template: str, subject: str, attribute: str) -> str:
    """`template` with [X] -> `subject` and [Y] -> `attribute`; ValueError unless each occurs once."""
    if template.count("[X]") != 1 or template.count("[Y]") != 1:
        raise ValueError(f"a template needs one [X] and one [Y]; got {template!r}")
    return template.replace("[X]", subject).replace("[Y]", attribute)


def probe_texts(template: str, subjects: Sequence[str]) -> list[str]:
    """The linear probe's texts: [X] filled, the literal "[Y]" left in (eval_classification.py replaces
    [X] alone)."""
    return [fill(template, s, "[Y]") for s in subjects]


def cloze_texts(template: str, subjects: Sequence[str], mask_token: str) -> list[str]:
    """The cloze's texts: [X] filled and [Y] -> the tokenizer's mask token (eval_zero_shot.py)."""
    return [fill(template, s, mask_token) for s in subjects]


# ----------------------------------------------------------------------------------------------------
# Rank correlations, row by row
# ----------------------------------------------------------------------------------------------------

def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of `a` against the same row of `b`, (n, k) -> (n,): the Pearson
    correlation of average ranks (scipy's `spearmanr`). NaN where a row is constant (rho undefined)."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"spearman_rows needs two arrays of one shape; got {a.shape} and {b.shape}")
    ra = scipy.stats.rankdata(a, axis=1)
    rb = scipy.stats.rankdata(b, axis=1)
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    norm = np.sqrt((ra ** 2).sum(1) * (rb ** 2).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (ra * rb).sum(1) / np.where(norm > 0, norm, 1.0), np.nan)


def kendall_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row of `a` against the same row of `b`, (n, k) -> (n,); NaN where a row is constant."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"kendall_rows needs two arrays of one shape; got {a.shape} and {b.shape}")
    out = np.full(len(a), np.nan)
    for i, (x, y) in enumerate(zip(a, b)):
        if np.ptp(x) > 0 and np.ptp(y) > 0:
            out[i] = scipy.stats.kendalltau(x, y).statistic
    return out


# ----------------------------------------------------------------------------------------------------
# The linear probe
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scores:
    """One template's per-subject results on a split: `correct` (n,) 1.0 or 0.0 and `spearman` (n,),
    both NaN where the protocol leaves the subject out. Their means over the rest are the figures."""

    correct: np.ndarray
    spearman: np.ndarray

    @property
    def accuracy(self) -> float:
        return finite_mean(self.correct)

    @property
    def mean_spearman(self) -> float:
        return finite_mean(self.spearman)

    @property
    def n(self) -> int:
        return int(np.isfinite(self.correct).sum())

    @property
    def n_spearman(self) -> int:
        return int(np.isfinite(self.spearman).sum())

    @property
    def spearman_se(self) -> float:
        """The standard error of `mean_spearman`: the per-subject rhos' standard deviation / sqrt(n)."""
        rho = self.spearman[np.isfinite(self.spearman)]
        return float(rho.std(ddof=1) / np.sqrt(len(rho))) if len(rho) > 1 else float("nan")


def finite_mean(x: np.ndarray) -> float:
    """The mean of the finite values of `x`; NaN where it has none (a column no subject has a figure in)."""
    x = np.asarray(x, dtype=np.float64)
    return float(x[np.isfinite(x)].mean()) if np.isfinite(x).any() else float("nan")


def fit_and_score(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                  test_dist: np.ndarray) -> Scores:
    """ViComTe's classifier on one template: `LogisticRegression(C=0.316, max_iter=2000, random_state=0)`
    fit on the train features and classes, scored on the test subjects.

    As eval_classification.py does: a test subject whose class never occurs in train is left out of both
    figures; Spearman compares `predict_proba` with the subject's counts over the classes seen in
    training (the classifier's columns), and leaves out a subject with no count among them (theirs drops
    a zero sum; a constant nonzero row has no rho either). The label is the file's `obj` even where the
    counts tie it with another class at the top (the real files: 80 / 18 / 38 such subjects of colour /
    shape / material): theirs reads `obj` and never the counts' argmax, so predicting the tied class is wrong,
    and Spearman gives tied counts their average rank (scipy's `spearmanr`, as theirs).
    """
    from sklearn.linear_model import LogisticRegression

    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    test_dist = np.asarray(test_dist, dtype=np.float64)
    if len(train_x) != len(train_y) or len(test_x) != len(test_y) or len(test_dist) != len(test_y):
        raise ValueError(f"features, classes and distributions disagree in length: train {len(train_x)}/{len(train_y)}, "
                         f"test {len(test_x)}/{len(test_y)}/{len(test_dist)}")
    if len(np.unique(train_y)) < 2:
        raise ValueError("the probe needs at least two classes in train")
    classifier = LogisticRegression(C=PROBE_C, max_iter=PROBE_MAX_ITER, random_state=PROBE_SEED)
    classifier.fit(np.asarray(train_x, dtype=np.float64), train_y)
    seen = classifier.classes_
    kept = np.isin(test_y, seen)
    correct = np.full(len(test_y), np.nan)
    spearman = np.full(len(test_y), np.nan)
    if kept.any():
        x = np.asarray(test_x, dtype=np.float64)[kept]
        correct[kept] = (classifier.predict(x) == test_y[kept]).astype(np.float64)
        spearman[kept] = spearman_rows(test_dist[kept][:, seen], classifier.predict_proba(x))
    return Scores(correct, spearman)


@dataclass(frozen=True)
class LinearProbe:
    """The linear probe of one row on one (relation, grouping): per template its test `Scores`, and its
    k-fold cross-validated accuracy and Spearman on train (`cv_accuracy`, `cv_spearman`, (templates,))."""

    test: list[Scores]
    cv_accuracy: np.ndarray
    cv_spearman: np.ndarray

    def oracle(self, metric: str) -> int:
        """The template best on test for `metric` ("accuracy" or "spearman"): what the authors report
        (`np.max` over templates, per metric). An oracle: it reads the test labels."""
        _check_metric(metric)
        return _best([s.accuracy if metric == "accuracy" else s.mean_spearman for s in self.test])

    def chosen(self, metric: str) -> int:
        """The template best for `metric` in cross-validation on train: a choice that sees no test label."""
        _check_metric(metric)
        return _best(self.cv_accuracy if metric == "accuracy" else self.cv_spearman)

    def per_subject(self, choice: str, metric: str) -> np.ndarray:
        """The per-subject results (`Scores.correct` or `.spearman`) of the template `choice` ("oracle" or
        "chosen") picks for `metric`: what `paired_bootstrap` compares."""
        if choice not in CHOICES:
            raise ValueError(f"unknown template choice {choice!r}; allowed: {', '.join(CHOICES)}")
        scores = self.test[self.oracle(metric) if choice == "oracle" else self.chosen(metric)]
        return scores.correct if metric == "accuracy" else scores.spearman


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")


def _best(values) -> int:
    """The index of the largest value, the first on ties; NaN counts as lowest."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v) or not np.isfinite(v).any():
        raise ValueError("no template has a finite figure to choose by")
    return int(np.argmax(np.where(np.isfinite(v), v, -np.inf)))


def cross_validate(train_x: np.ndarray, train_y: np.ndarray, train_dist: np.ndarray, n_folds: int,
                   seed: int) -> Scores:
    """Every train subject scored by the classifier fit on the other folds (`fit_and_score`): k-fold,
    shuffled with `seed`. Not in the authors' scripts; it lets the probe choose a template on train.
    A fold whose other folds hold one class alone (a heavily skewed split, few of the rest) fits no classifier:
    its subjects are left out (NaN), as a test subject of a class unseen in training is."""
    from sklearn.model_selection import KFold

    if n_folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds; got {n_folds}")
    train_x, train_y, train_dist = np.asarray(train_x), np.asarray(train_y), np.asarray(train_dist)
    correct = np.full(len(train_y), np.nan)
    spearman = np.full(len(train_y), np.nan)
    for fit, held in KFold(n_splits=n_folds, shuffle=True, random_state=seed).split(train_x):
        if len(np.unique(train_y[fit])) < 2:
            continue
        s = fit_and_score(train_x[fit], train_y[fit], train_x[held], train_y[held], train_dist[held])
        correct[held], spearman[held] = s.correct, s.spearman
    return Scores(correct, spearman)


def linear_probe(train_features: Sequence[np.ndarray], train_y: np.ndarray, train_dist: np.ndarray,
                 test_features: Sequence[np.ndarray], test_y: np.ndarray, test_dist: np.ndarray, *,
                 n_folds: int, seed: int, n_jobs: int = 1) -> LinearProbe:
    """ViComTe's linear probe of one row over all templates: `train_features[t]` (n_train, d) and
    `test_features[t]` (n_test, d) are the row's features of template t's texts (`probe_texts`), the
    classes (n,) index the class list, the distributions (n, classes) are the subjects' counts.
    The templates are fit in `n_jobs` processes (joblib); each fit is the same in any of them."""
    from joblib import Parallel, delayed

    if len(train_features) != len(test_features) or not train_features:
        raise ValueError(f"train and test need features of the same templates, at least one; got "
                         f"{len(train_features)} and {len(test_features)}")
    done = Parallel(n_jobs=min(n_jobs, len(train_features)))(
        delayed(_one_template)(train_x, train_y, train_dist, test_x, test_y, test_dist, n_folds, seed)
        for train_x, test_x in zip(train_features, test_features))
    test, cv = zip(*done)
    return LinearProbe(list(test), np.array([c.accuracy for c in cv]), np.array([c.mean_spearman for c in cv]))


def _one_template(train_x, train_y, train_dist, test_x, test_y, test_dist, n_folds: int, seed: int) -> tuple[Scores, Scores]:
    """One template's probe: (its test scores, its cross-validated scores on train)."""
    return (fit_and_score(train_x, train_y, test_x, test_y, test_dist),
            cross_validate(train_x, train_y, train_dist, n_folds, seed))


# ----------------------------------------------------------------------------------------------------
# The zero-shot cloze
# ----------------------------------------------------------------------------------------------------

def mask_log_probs(encoder, head, tokenizer, texts: Sequence[str], batch_size: int,
                   classes: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """Log-softmax over the vocabulary at each text's one mask token, (texts, vocab) float64, from an MLM as its
    encoder (a transformers encoder: its output's `last_hidden_state`) and its head (states (n, d) -> vocabulary
    logits (n, vocab)). The head runs at the masks alone: at every position its vocabulary logits would be most of
    the cloze's cost. With `classes` (per class its token ids, as `class_token_ids` gives them) each batch folds
    into `class_scores` at once and (texts, classes) comes back: the whole vocabulary for every text would be
    about 700 MB for one colour template at paper sizes. ValueError unless each text holds the mask token exactly
    once. Both are put in eval mode."""
    import torch

    head.eval()
    out = []
    with torch.no_grad():
        for chunk in _chunks(encoder, texts, batch_size):
            batch = tokenizer(chunk, padding=True, return_tensors="pt")
            at_mask = batch["input_ids"] == tokenizer.mask_token_id
            for count, text in zip(at_mask.sum(1).tolist(), chunk):
                if count != 1:
                    raise ValueError(f"a cloze text needs one {tokenizer.mask_token}; {text!r} has {count}")
            batch = {k: v.to(_device(encoder)) for k, v in batch.items()}
            states = encoder(**batch).last_hidden_state[at_mask.to(_device(encoder))]  # (B, d), row order kept
            log_probs = torch.log_softmax(head(states).double(), dim=-1).cpu().numpy()
            out.append(log_probs if classes is None else class_scores(log_probs, classes))
    width = len(tokenizer) if classes is None else len(classes)
    return np.concatenate(out) if out else np.zeros((0, width))


def first_subword(tokenizer, word: str) -> int:
    """The id of `word`'s first sub-word: eval_zero_shot.py scores a class word by `encode(word)[1]`, the
    token after [CLS]."""
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if not ids or ids[0] == tokenizer.unk_token_id:
        raise ValueError(f"the word {word!r} has no known first sub-word in this vocabulary (tokens {ids})")
    return int(ids[0])


def class_token_ids(tokenizer, words: Mapping[str, Sequence[str]]) -> list[list[int]]:
    """Per class (in the order of `words`) the first sub-words of the words that fold into it, each once:
    `words` maps a class to its word file's words, the class word itself included where the file lists it
    (models.py `load_word_file`; every colour, shape and material class lists itself). Synonyms that
    share a first sub-word count once, as eval_zero_shot.py's `get_token_ids` skips repeats."""
    out = []
    for cls, ws in words.items():
        if not ws:
            raise ValueError(f"the class {cls!r} has no word")
        ids = []
        for w in ws:
            t = first_subword(tokenizer, w)
            if t not in ids:
                ids.append(t)
        out.append(ids)
    return out


def merged_classes(tokenizer, words: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The classes the cloze cannot tell apart in this vocabulary: groups of classes (sorted, each group
    sorted) joined by a first sub-word that words of two or more of them share. Empty when none do.
    The authors assert that the class words' first sub-words differ; synonyms can collide too, and a
    shared token gives two classes the same evidence, and a tie that counts as top-1 for both."""
    owners: dict[int, set[str]] = {}
    for cls, ids in zip(words, class_token_ids(tokenizer, words)):
        for t in ids:
            owners.setdefault(t, set()).add(cls)
    groups: list[set[str]] = []
    for classes in owners.values():
        if len(classes) < 2:
            continue
        joined = [g for g in groups if g & classes]
        groups = [g for g in groups if not g & classes] + [set(classes).union(*joined)]
    return sorted(sorted(g) for g in groups)


def class_scores(log_probs: np.ndarray, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Each class's score at the mask: the log-sum-exp of its first sub-words' log-probabilities
    (eval_zero_shot.py `get_model_dist`: log of the summed probabilities of the synonyms).
    log_probs (..., vocab) -> (..., classes)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    return np.stack([logsumexp(lp[..., list(ids)], axis=-1) for ids in token_ids], axis=-1)


def zero_shot(scores: np.ndarray, labels: np.ndarray, dist: np.ndarray) -> Scores:
    """The cloze's per-subject results from class scores (subjects, templates, classes):

    - top-1 correct where some template scores the subject's class at its maximum (eval_zero_shot.py
      compares with the max, so a tie counts as correct);
    - Spearman: per template against the subject's counts over all classes, the best template's
      (max over templates, a per-subject upper bound as theirs); NaN where the counts are constant.
    Every test subject counts, as theirs divides by the whole test split.
    """
    s = np.asarray(scores, dtype=np.float64)
    labels, dist = np.asarray(labels), np.asarray(dist, dtype=np.float64)
    if s.ndim != 3 or len(s) != len(labels) or dist.shape != (len(s), s.shape[2]):
        raise ValueError(f"zero_shot needs scores (subjects, templates, classes), labels (subjects,) and dist "
                         f"(subjects, classes); got {s.shape}, {labels.shape}, {dist.shape}")
    top = s.max(2)                                                      # (subjects, templates)
    own = np.take_along_axis(s, labels[:, None, None], axis=2)[..., 0]  # (subjects, templates)
    correct = (own >= top).any(1).astype(np.float64)
    n, t, k = s.shape
    rho = spearman_rows(np.repeat(dist, t, axis=0), s.reshape(n * t, k)).reshape(n, t)
    spearman = np.where(np.isfinite(rho).any(1), np.nanmax(np.where(np.isfinite(rho), rho, -np.inf), 1), np.nan)
    return Scores(correct, spearman)
