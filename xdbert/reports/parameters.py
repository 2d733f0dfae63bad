"""Table 6 of the paper: the parameters of each family's language encoder and of its whole cross-modal model.

The counts are the ones each family's `adapt@<family>` stage took of the model it built (`parameters` of
metrics/adapt/<family>/xdbert.json, `xdbert.model.modeling.count_parameters`): what the models really have,
never adjusted to match the paper. The paper profile shows the paper's count beside each and the difference.
"""
from __future__ import annotations

from pathlib import Path

from xdbert.reports.header import header
from xdbert.reports.settings import AggregateSettings
from xdbert.reports.tables import models_line, proposed_metric

# The paper's Table 6, by our row labels: an encoder family's label and its whole model's (`Family.full_label`)
PAPER_TABLE6 = {"BERT-b": 109_482_240, "XBERT-b": 202_059_009, "ELECTRA-b": 109_482_240, "XELECTRA-b": 202_059_009,
                "ELECTRA-l": 334_092_288, "XELECTRA-l": 442_671_617}


def table6(s: AggregateSettings, adapt_metrics_dir: Path) -> str:
    """reports/table6.md: per family, its language encoder and its whole model (encoder, CLIP text tower and
    cross-modal layers, as the paper counts it), with the part sizes and, in the paper profile, the paper's count."""
    paper = s.profile == "paper"
    lines = ["| model | parameters | language encoder | CLIP text tower | cross-modal layers |"
             + (" paper (Table 6) | difference |" if paper else ""),
             "|---|---|---|---|---|" + ("---|---|" if paper else "")]
    heads, differs = [], False
    for f in s.families.values():
        n = proposed_metric(adapt_metrics_dir, f.name, "parameters")
        for label, count, parts in ((f.label, n["encoder"], (n["encoder"], None, None)),
                                    (f.full_label, n["backbone"], (n["encoder"], n["clip"], n["cross"]))):
            row = f"| {label} | {count:,} | " + " | ".join(f"{c:,}" if c is not None else "-" for c in parts) + " |"
            if paper:
                theirs = PAPER_TABLE6.get(label)
                row += f" {theirs:,} | {count - theirs:+,} |" if theirs is not None else " - | - |"
                differs |= theirs is not None and count != theirs
            lines.append(row)
        heads.append(f"{n['heads']:,} to {f.full_label}")
    note = ("\nCounted on the model each family's `adapt@<family>` stage built (`parameters` of "
            "metrics/adapt/<family>/xdbert.json), each shared tensor once. The whole model is the language encoder, "
            "CLIP's text tower (with `text_projection` and `logit_scale`) and the cross-modal layers; the pretraining "
            f"heads are not counted, as in the paper (they add {', '.join(heads)}).\n")
    if differs:
        note += ("\nA difference is what the built model really has, not adjusted to match. Transformers' `ElectraModel` "
                 "has no pooler, which `BertModel` has (hidden² + hidden: 590,592 at width 768), and the paper lists "
                 "ELECTRA-b with BERT-b's count. A rehearsal at tiny sizes (`xdbert rehearse --sizes tiny`) builds "
                 "small models under the paper's ids, so every count differs there.\n")
    return header("Table 6: parameters", s.profile, models_line(s)) + "\n" + "\n".join(lines) + "\n" + note
