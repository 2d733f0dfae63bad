"""The visually grounded ratio of dev examples that XDBERT improves or worsens (paper Figure 4, Appendix D).

Definitions (the paper follows Vokenization, Tan and Bansal 2020):

- A WORD is visually grounded if it is not a stopword and occurs MORE than `threshold` times (100 in
  the paper) in a caption corpus (MSCOCO captions in the paper profile). Every other content word is
  not grounded. Stopwords (a named list, `xdbert/resources/stopwords_en.txt`), punctuation (a word with no
  letter or digit) and the tokenizer's special tokens (`[UNK]`) count toward neither class.
- Word-piece rule: the unit is the WHOLE word. Texts are cut with the BERT tokenizer and its word
  pieces are merged back (`qu ##aran ##tine` -> `quarantine`) before a word is classified, and the
  caption corpus is cut and merged the same way, so both sides count the same units. A word split
  into three pieces therefore counts once, not three times.
- ratio = grounded / (grounded + not grounded) over the example's text (text_a and text_b). An
  example without any content word has no ratio (NaN): it is left out of the box plots and means
  and counted separately.
- Per dev example, `correct` is counted over the seeds for XDBERT and for the baseline (both have the
  same seeds); more for XDBERT = improved, fewer = worsened, equal = on par (set aside in the plot).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from xdbert.data.tasks.registry import get_task, read_split
from xdbert.errors import PipelineError
from xdbert.finetuning.control.predictions import RERUN, read_predictions
from xdbert.paths import TASKS, predictions

GROUNDED, NOT_GROUNDED, STOPWORD, PUNCTUATION = "grounded", "not_grounded", "stopword", "punctuation"
CHANGES = ("improved", "on_par", "worsened")
# the classification tasks (an example is right or wrong per seed), with their names in the paper
TASK_TITLES = {"rte": "RTE", "mrpc": "MRPC", "cola": "CoLA", "sst2": "SST-2", "qnli": "QNLI", "qqp": "QQP", "mnli": "MNLI"}
STOPWORDS_FILE = Path(__file__).resolve().parents[1] / "resources" / "stopwords_en.txt"
WORD_COUNTS_FILE = "word_counts.json"  # in data/captions: the `captions` stage writes its captions' counts

Tokenize = Callable[[list[str]], list[list[str]]]   # texts -> word pieces of each text


# ----------------------------------------------------------------------------------------------------
# Words and their classes
# ----------------------------------------------------------------------------------------------------

def load_stopwords(path: str | Path | None = None) -> frozenset[str]:
    """A stopword list, one word per line, `#` comments; default: the shipped NLTK English list."""
    path = Path(path) if path else STOPWORDS_FILE
    if not path.is_file():
        raise PipelineError(f"missing stopword list {path}: give a file with one word per line (`grounding.stopwords`), "
                            f"or leave it empty for the shipped NLTK English list")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PipelineError(f"stopword list {path} (`grounding.stopwords`) is not UTF-8 text: give a file with one "
                            f"word per line") from e
    words = [ln.strip().lower() for ln in text.splitlines()]
    words = [w for w in words if w and not w.startswith("#")]
    if not words:
        raise PipelineError(f"stopword list {path} has no words")
    return frozenset(words)


def merge_wordpieces(tokens: Sequence[str], prefix: str = "##") -> list[str]:
    """Whole words from WordPiece tokens: a `##piece` is appended to the word before it."""
    words: list[str] = []
    for tok in tokens:
        if tok.startswith(prefix) and words:
            words[-1] += tok[len(prefix):]
        else:
            words.append(tok[len(prefix):] if tok.startswith(prefix) else tok)
    return words


def is_punctuation(word: str) -> bool:
    return not any(c.isalnum() for c in word)


def wordpiece_tokenizer(tokenizer) -> tuple[Tokenize, str, frozenset[str]]:
    """(tokenize, continuation prefix, special tokens) of a fast transformers WordPiece tokenizer."""
    if not getattr(tokenizer, "is_fast", False):
        raise PipelineError(f"{type(tokenizer).__name__} is not a fast tokenizer; the grounding analysis needs one with tokenizer.json")
    prefix = getattr(tokenizer.backend_tokenizer.model, "continuing_subword_prefix", None) or "##"

    def tokenize(texts: list[str]) -> list[list[str]]:
        enc = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)
        return [enc.tokens(i) for i in range(len(texts))]

    specials = frozenset(t.lower() for t in tokenizer.all_special_tokens)
    return tokenize, prefix, specials


def text_words(texts: list[str], tokenize: Tokenize, prefix: str = "##") -> list[list[str]]:
    """Lowercased whole words of each text, cut by `tokenize` (the BERT tokenizer) and merged back."""
    return [[w.lower() for w in merge_wordpieces(pieces, prefix)] for pieces in tokenize(texts)]


def caption_word_counts(captions: Iterable[str], tokenize: Tokenize, batch_size: int = 4096, prefix: str = "##") -> Counter:
    """How often every whole word occurs in the caption corpus (same tokenizer and merge as the texts)."""
    counts: Counter = Counter()
    batch: list[str] = []
    for caption in captions:
        batch.append(caption)
        if len(batch) == batch_size:
            for words in text_words(batch, tokenize, prefix):
                counts.update(words)
            batch = []
    if batch:
        for words in text_words(batch, tokenize, prefix):
            counts.update(words)
    return counts


def read_word_counts(folder: Path) -> dict:
    """word_counts.json of the `captions` stage: {"source", "captions", "counts"}."""
    path = Path(folder) / WORD_COUNTS_FILE
    if not path.is_file():
        raise PipelineError(f"missing {path}: run `dvc repro captions`")
    return json.loads(path.read_text(encoding="utf-8"))


def classify(words: Sequence[str], stopwords: frozenset[str], counts: Mapping[str, int], threshold: int,
             specials: frozenset[str] = frozenset()) -> list[str]:
    """The class of every word: grounded, not_grounded, stopword or punctuation (specials: punctuation).

    Grounded means strictly MORE than `threshold` caption occurrences, as the paper states it.
    """
    out = []
    for w in words:
        if w in specials or is_punctuation(w):
            out.append(PUNCTUATION)
        elif w in stopwords:
            out.append(STOPWORD)
        elif counts.get(w, 0) > threshold:
            out.append(GROUNDED)
        else:
            out.append(NOT_GROUNDED)
    return out


@dataclass(frozen=True)
class GroundedCount:
    grounded: int
    not_grounded: int

    @property
    def ratio(self) -> float:
        """grounded / (grounded + not grounded); NaN for an example without content words."""
        n = self.grounded + self.not_grounded
        return self.grounded / n if n else float("nan")


def count_classes(classes: Sequence[str]) -> GroundedCount:
    c = Counter(classes)
    return GroundedCount(c[GROUNDED], c[NOT_GROUNDED])


def mark_words(words: Sequence[str], classes: Sequence[str]) -> str:
    """Appendix D's notation: **grounded**, plain not grounded, (stopword or punctuation)."""
    marked = []
    for w, c in zip(words, classes):
        w = w.replace("*", "\\*").replace("|", "\\|")
        marked.append(f"**{w}**" if c == GROUNDED else w if c == NOT_GROUNDED else f"({w})")
    return " ".join(marked)


# ----------------------------------------------------------------------------------------------------
# Comparing the two models' predictions
# ----------------------------------------------------------------------------------------------------

def correct_per_example(preds: pd.DataFrame, what: str) -> tuple[pd.Series, list[int]]:
    """(number of seeds right per example idx, the seeds) from a predictions table of one split, as
    `read_predictions` checked it."""
    if preds.empty:
        raise PipelineError(f"{what} has no dev predictions; {RERUN}")
    seeds = sorted(int(s) for s in preds["seed"].unique())
    return preds.groupby("idx")["correct"].apply(lambda c: int(np.sum(c.astype(bool)))), seeds


def compare_models(baseline: pd.DataFrame, proposed: pd.DataFrame, names: tuple[str, str] = ("baseline", "xdbert")) -> pd.DataFrame:
    """Per dev example: seeds right for each model, their difference and the change class.

    Returns columns idx, baseline_correct, proposed_correct, delta (proposed - baseline), change
    (improved / on_par / worsened), sorted by idx. Both tables must hold the same seeds and examples.
    """
    b, b_seeds = correct_per_example(baseline, f"predictions of `{names[0]}`")
    p, p_seeds = correct_per_example(proposed, f"predictions of `{names[1]}`")
    if b_seeds != p_seeds:
        raise PipelineError(f"`{names[0]}` has seeds {b_seeds} but `{names[1]}` has {p_seeds}; the comparison needs the "
                            f"same seeds for both (rerun finetuning with the same `finetune` seeds)")
    if set(b.index) != set(p.index):
        raise PipelineError(f"`{names[0]}` and `{names[1]}` predicted different dev examples; rerun both finetune stages")
    out = pd.DataFrame({"idx": b.index.astype(np.int64), "baseline_correct": b.to_numpy(),
                        "proposed_correct": p.loc[b.index].to_numpy()})
    out["delta"] = out["proposed_correct"] - out["baseline_correct"]
    out["change"] = np.select([out["delta"] > 0, out["delta"] < 0], ["improved", "worsened"], "on_par")
    out = out.sort_values("idx").reset_index(drop=True)
    out.attrs["n_seeds"] = len(b_seeds)
    return out


def class_summary(ratios: np.ndarray) -> dict[str, float | int]:
    """n, quartiles, median and mean of the ratios of one class (NaN ratios left out, counted)."""
    r = np.asarray(ratios, dtype=np.float64)
    valid = r[~np.isnan(r)]
    out: dict[str, float | int] = {"n": int(valid.size), "no_content_words": int(np.isnan(r).sum())}
    if valid.size:
        q1, med, q3 = np.percentile(valid, [25, 50, 75])
        out.update(q1=float(q1), median=float(med), q3=float(q3), mean=float(valid.mean()))
    else:
        out.update(q1=float("nan"), median=float("nan"), q3=float("nan"), mean=float("nan"))
    return out


def improved_vs_worsened(improved: np.ndarray, worsened: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value that the two classes' ratios come from one distribution."""
    from scipy.stats import mannwhitneyu

    a, b = (np.asarray(x, dtype=np.float64) for x in (improved, worsened))
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if a.size == 0 or b.size == 0:
        return float("nan")
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass(frozen=True)
class Grounding:
    """The whole classification rule in one object: tokenizer, stopwords, caption counts and threshold."""

    tokenize: Tokenize
    stopwords: frozenset[str]
    counts: Mapping[str, int]
    threshold: int
    prefix: str = "##"
    specials: frozenset[str] = frozenset()

    def words(self, texts: list[str]) -> list[tuple[list[str], list[str]]]:
        """(whole words, their classes) of every text."""
        return [(w, classify(w, self.stopwords, self.counts, self.threshold, self.specials))
                for w in text_words(texts, self.tokenize, self.prefix)]

    @property
    def grounded_vocabulary(self) -> list[str]:
        """The caption-corpus words that count as grounded."""
        return sorted(w for w, c in self.counts.items()
                      if c > self.threshold and w not in self.stopwords and w not in self.specials and not is_punctuation(w))


def annotate(cmp: pd.DataFrame, texts_a: list[str], texts_b: list[str], rule: Grounding) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Add grounded / not_grounded / ratio columns to `compare_models`' table (texts in its row order).

    Returns (the table, text_a and text_b of every row in Appendix D's marked notation).
    """
    a, b = rule.words(texts_a), rule.words(texts_b)
    found = [count_classes(ca + cb) for (_, ca), (_, cb) in zip(a, b)]
    cmp = cmp.copy()
    cmp["grounded"] = [c.grounded for c in found]
    cmp["not_grounded"] = [c.not_grounded for c in found]
    cmp["ratio"] = [c.ratio for c in found]
    return cmp, [mark_words(*x) for x in a], [mark_words(*x) for x in b]


def task_summary(cmp: pd.DataFrame, n_seeds: int) -> dict:
    """Counts, extra correct answers over all seeds, per-class ratio statistics, improved-vs-worsened test."""
    by_class = {c: cmp.loc[cmp["change"] == c, "ratio"].to_numpy() for c in CHANGES}
    extra = int(cmp["delta"].sum())
    return {
        "seeds": n_seeds, "examples": len(cmp), "extra_correct": extra,
        "gain_percent": 100.0 * extra / n_seeds / max(len(cmp), 1),
        "classes": {c: class_summary(by_class[c]) for c in CHANGES},
        "mannwhitney_p": improved_vs_worsened(by_class["improved"], by_class["worsened"]),
    }


def extreme_examples(cmp: pd.DataFrame, k: int) -> dict[str, pd.DataFrame]:
    """Appendix D's choice: the k most improved, k on-par (first by idx) and k most worsened examples."""
    return {"improved": cmp[cmp["change"] == "improved"].sort_values(["delta", "idx"], ascending=[False, True]).head(k),
            "on_par": cmp[cmp["change"] == "on_par"].sort_values("idx").head(k),
            "worsened": cmp[cmp["change"] == "worsened"].sort_values(["delta", "idx"]).head(k)}


def compare_task(task: str, names: tuple[str, str], rule: Grounding, examples_per_class: int | None = None,
                 ) -> tuple[dict, dict[str, np.ndarray], dict[str, list]]:
    """Figure 4 for one task: the two runs' dev predictions compared example by example, under `rule`.

    Returns (the task's summary, the ratios of each change class, and with `examples_per_class` the
    extreme examples of each class as (row, marked text_a, marked text_b, seeds); else {}).
    """
    split = get_task(task).dev_splits[0]
    base, prop = (read_predictions(predictions(task, m)) for m in names)
    cmp = compare_models(base[base["split"] == split], prop[prop["split"] == split], names)
    n_seeds = cmp.attrs["n_seeds"]
    dev = read_split(TASKS, task, split).to_pandas().set_index("idx")
    missing = sorted(set(cmp["idx"]) - set(dev.index))
    if missing:
        raise PipelineError(f"predictions of {task} name dev examples {missing[:5]} absent from {TASKS}/{task}: rerun finetuning")
    rows = dev.loc[cmp["idx"]]
    texts_b = [b if isinstance(b, str) else "" for b in rows["text_b"]]
    cmp, marked_a, marked_b = annotate(cmp, list(rows["text_a"]), texts_b, rule)
    summary = {"split": split, **task_summary(cmp, n_seeds)}
    ratios = {c: cmp.loc[cmp["change"] == c, "ratio"].to_numpy() for c in CHANGES}
    examples: dict[str, list] = {}
    if examples_per_class:
        pos = {idx: i for i, idx in enumerate(cmp["idx"])}
        examples = {c: [(r, marked_a[pos[r.idx]], marked_b[pos[r.idx]], n_seeds) for r in picked.itertuples()]
                    for c, picked in extreme_examples(cmp, examples_per_class).items()}
    return summary, ratios, examples

