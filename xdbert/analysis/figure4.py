"""Figure 4 of the paper and its report: box plots of the visually grounded ratio per class, and
reports/figure4.md (the rule, extra correct answers, ratio statistics, marked examples)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from xdbert.analysis.grounding import TASK_TITLES, Grounding

PLOTTED = ("improved", "worsened")   # the paper's Figure 4 sets on-par examples aside
PAPER_NOTE = "*Paper: XDBERT-b +38 correct RTE answers over 5 runs (+2.74% = 38/5/277).*"


def plot_boxes(ratios: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path, title: str = "") -> Path:
    """One panel per task, a box per plotted class (improved, worsened), the mean as a green plus.

    `ratios[task][change]` holds that class's ratios (NaN entries are dropped). Writes a PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(ratios)
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.6), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        data, labels = [], []
        for change in PLOTTED:
            r = np.asarray(ratios[task].get(change, []), dtype=np.float64)
            r = r[~np.isnan(r)]
            labels.append(f"{change}\n(n={r.size})")
            data.append(r if r.size else np.array([np.nan]))
        ax.boxplot(data, showmeans=True, tick_labels=labels, widths=0.6,
                   meanprops={"marker": "+", "markeredgecolor": "green", "markersize": 10, "markeredgewidth": 2})
        ax.set_title(TASK_TITLES.get(task, task))
        ax.set_ylim(-0.02, 1.02)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("visually grounded ratio")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)
    return path


def _f(x: float) -> str:
    return "-" if x != x else f"{x:.3f}"  # NaN -> "-"


def figure4_markdown(head: str, summary: dict, examples: dict, names: tuple[str, str], rule_text: str,
                     titles: Mapping[str, str], examples_task: str, paper_note: str = "") -> str:
    """reports/figure4.md: the rule, extra correct answers, quartiles and means per class, marked examples.

    `examples[change]` is a list of (row of the annotated table, marked text_a, marked text_b, seeds).
    """
    base, model = names
    md = [head, "![Figure 4](figure4.png)", "", rule_text, "", "## Extra correct answers over all seeds", "",
          "| task | seeds | dev examples | improved | on par | worsened | extra correct | gain | Mann-Whitney p (improved vs worsened) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for task, t in summary.items():
        n = {c: t["classes"][c]["n"] + t["classes"][c]["no_content_words"] for c in t["classes"]}
        md.append(f"| {titles.get(task, task)} | {t['seeds']} | {t['examples']} | {n['improved']} | {n['on_par']} | "
                  f"{n['worsened']} | {t['extra_correct']:+d} | {t['gain_percent']:+.2f}% | {_f(t['mannwhitney_p'])} |")
    if paper_note:
        md += ["", paper_note]
    md += ["", "## Ratio per class", "", "| task | class | n | Q1 | median | Q3 | mean | no content words |",
           "|---|---|---|---|---|---|---|---|"]
    for task, t in summary.items():
        for c, v in t["classes"].items():
            md.append(f"| {titles.get(task, task)} | {c} | {v['n']} | {_f(v['q1'])} | {_f(v['median'])} | {_f(v['q3'])} | "
                      f"{_f(v['mean'])} | {v['no_content_words']} |")
    md += ["", f"## Examples ({titles.get(examples_task, examples_task)}, Appendix D style)", "",
           "**Bold** words are visually grounded, plain words are not, (bracketed) words are stopwords or punctuation "
           "and count toward neither. Improved and worsened examples are the most extreme ones.", ""]
    for change, rows in examples.items():
        md += [f"### {change.replace('_', ' ')}", ""] + (["(none)", ""] if not rows else [])
        for row, a, b, n_seeds in rows:
            md += [f"- idx {row.idx}: visually grounded ratio {row.grounded}/({row.grounded}+{row.not_grounded}) = "
                   f"{_f(row.ratio)}; `{base}` right {row.baseline_correct}/{n_seeds}, `{model}` right "
                   f"{row.proposed_correct}/{n_seeds}", "", f"  > {a}"] + (["  >", f"  > {b}"] if b else []) + [""]
    return "\n".join(md) + "\n"


def rule_text(rule: Grounding, source: str, n_captions: int, names: tuple[str, str]) -> str:
    """The paragraph of reports/figure4.md that states the counting rule and the caption corpus."""
    base, model = names
    return (
        f"A whole word (BERT word pieces merged back) is **visually grounded** if it is not a stopword (NLTK English list "
        f"unless `grounding.stopwords` names another) and occurs more than {rule.threshold} times in the caption corpus: "
        f"{source}, {n_captions} captions, {len(rule.grounded_vocabulary)} grounded words. Stopwords and punctuation count toward "
        f"neither class; ratio = grounded / (grounded + not grounded) over text_a and text_b. An example is *improved* if "
        f"`{model}` is right on more seeds than `{base}`, *worsened* if on fewer; on-par examples are set "
        f"aside in the figure. Examples without any content word have no ratio and are counted apart.")
