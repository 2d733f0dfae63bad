"""Stage `grounding`: paper Figure 4 and Appendix D, the visually grounded ratio of improved/worsened examples.

    deps:   results/finetune (the runs <adapt.family>/<baseline|model> of each task), data/tasks, models/tokenizer,
            data/captions (the `captions` stage's word counts of the caption corpus)
    outs:   reports/figure4.png, reports/figure4.md, results/grounding.json

The caption corpus (`grounding.captions`: generated, MSCOCO's captions file or a `datasets` id) is the
`captions` stage's (xdbert/data/captions.py); the rule is in xdbert/analysis/grounding.py.
"""
from __future__ import annotations

from collections import Counter

from xdbert import io
from xdbert import params as P
from xdbert.analysis import grounding as G
from xdbert.analysis.grounding_settings import GroundingSettings
from xdbert.paths import CAPTIONS, FIGURE4, GROUNDING_METRICS, TOKENIZER, report
from xdbert.stage import run


def read(p: dict) -> tuple[str, GroundingSettings]:
    """(profile, settings): every param this stage reads, checked; tools/dvc_yaml.py records them for its
    `params:` in dvc.yaml."""
    return p["profile"], GroundingSettings.from_params(p, files=False)


def main() -> None:
    profile, s = read(P.load())
    s.check_files()
    counted = G.read_word_counts(CAPTIONS)

    from xdbert.analysis import figure4
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.reports.header import header

    tokenize, prefix, specials = G.wordpiece_tokenizer(load_encoder_tokenizer(TOKENIZER))
    stopwords = G.load_stopwords(s.stopwords)
    rule = G.Grounding(tokenize, stopwords, Counter(counted["counts"]), s.threshold, prefix, specials)

    summary, ratios, examples = {}, {}, {}
    for task in s.tasks:
        wanted = s.examples_per_class if task == s.examples_task else None
        summary[task], ratios[task], picked = G.compare_task(task, s.names, rule, wanted)
        if task == s.examples_task:
            examples = picked

    with io.atomic_path(FIGURE4) as tmp:
        figure4.plot_boxes(ratios, tmp, title=f"visually grounded ratio, {s.model} vs {s.baseline} ({profile} profile)")
    io.write_json(GROUNDING_METRICS, {"profile": profile, "threshold": rule.threshold, "captions": counted["source"],
                                      "grounded_words": len(rule.grounded_vocabulary), "tasks": summary})
    head = header("Figure 4: visually grounded ratio of examples XDBERT improves or worsens", profile,
                  f"`{s.model}` vs `{s.baseline}`", ", ".join(f"{t}: {v['seeds']}" for t, v in summary.items()))
    paper_note = figure4.PAPER_NOTE if profile == "paper" else ""
    io.write_text(report("figure4"), figure4.figure4_markdown(
        head, summary, examples, s.names, figure4.rule_text(rule, counted["source"], counted["captions"], s.names), G.TASK_TITLES,
        s.examples_task, paper_note))
    for task, t in summary.items():
        c = t["classes"]
        print(f"grounding {task}: {t['extra_correct']:+d} correct over {t['seeds']} seeds; mean ratio improved "
              f"{c['improved']['mean']:.3f} (n={c['improved']['n']}) vs worsened {c['worsened']['mean']:.3f} (n={c['worsened']['n']})")


if __name__ == "__main__":
    run(main)
