"""Stage `grounding`: paper Figure 4 and Appendix D, the visually grounded ratio of improved/worsened examples.

    deps:   results/finetune (the runs <adapt.family>/<baseline|model> of each task), data/tasks, models/tokenizer,
            inputs (COCO's captions, where a file is named)
    outs:   reports/figure4.png, reports/figure4.md, results/grounding.json,
            data/captions (word_counts.json; captions.json in COCO's format when generated)

`grounding.captions`: `generated` (the embedded profile: COCO-like captions built from the corpus's
concrete vocabulary), a `.json` file in the layout of COCO's captions_train2017.json, or a `datasets`
id / folder (`captions_hub_split`, `captions_hub_column`). The rule is in xdbert/analysis/grounding.py.
"""
from __future__ import annotations

from xdbert import io
from xdbert import params as P
from xdbert.analysis import grounding as G
from xdbert.paths import CAPTIONS, FIGURE4, GROUNDING_METRICS, TOKENIZER, report
from xdbert.stage import run


def read(p: dict) -> tuple[str, G.GroundingSettings]:
    """(profile, settings): every param this stage reads, checked; tools/dvc_yaml.py records them for its
    `params:` in dvc.yaml."""
    return p["profile"], G.GroundingSettings.from_params(p, files=False)


def main() -> None:
    profile, s = read(P.load())
    s.check_files()

    from xdbert.analysis import figure4
    from xdbert.data.tokenization.vocab import load_encoder_tokenizer
    from xdbert.reports.header import header

    tokenize, prefix, specials = G.wordpiece_tokenizer(load_encoder_tokenizer(TOKENIZER))
    stopwords = G.load_stopwords(s.stopwords)
    captions, source = s.load_captions()
    rule = G.Grounding(tokenize, stopwords, G.caption_word_counts(captions, tokenize, prefix=prefix), s.threshold,
                       prefix, specials)

    summary, ratios, examples = {}, {}, {}
    for task in s.tasks:
        wanted = s.examples_per_class if task == s.examples_task else None
        summary[task], ratios[task], picked = G.compare_task(task, s.names, rule, wanted)
        if task == s.examples_task:
            examples = picked

    with io.atomic_path(CAPTIONS, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        if s.captions == "generated":
            G.write_coco_captions(captions, tmp / "captions.json")
        io.write_json(tmp / "word_counts.json", {"source": source, "captions": len(captions), "counts": dict(rule.counts.most_common())})
    with io.atomic_path(FIGURE4) as tmp:
        figure4.plot_boxes(ratios, tmp, title=f"visually grounded ratio, {s.model} vs {s.baseline} ({profile} profile)")
    io.write_json(GROUNDING_METRICS, {"profile": profile, "threshold": rule.threshold, "captions": source,
                                      "grounded_words": len(rule.grounded_vocabulary), "tasks": summary})
    head = header("Figure 4: visually grounded ratio of examples XDBERT improves or worsens", profile,
                  f"`{s.model}` vs `{s.baseline}`", ", ".join(f"{t}: {v['seeds']}" for t, v in summary.items()))
    paper_note = figure4.PAPER_NOTE if profile == "paper" else ""
    io.write_text(report("figure4"), figure4.figure4_markdown(
        head, summary, examples, s.names, figure4.rule_text(rule, source, len(captions), s.names), G.TASK_TITLES,
        s.examples_task, paper_note))
    for task, t in summary.items():
        c = t["classes"]
        print(f"grounding {task}: {t['extra_correct']:+d} correct over {t['seeds']} seeds; mean ratio improved "
              f"{c['improved']['mean']:.3f} (n={c['improved']['n']}) vs worsened {c['worsened']['mean']:.3f} (n={c['worsened']['n']})")


if __name__ == "__main__":
    run(main)
