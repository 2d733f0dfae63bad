"""Stage `probes`: the visual-knowledge probes of issue 56 (../shared/PROBES.md), ViComTe and CoDa, on every encoder.

    deps:   models/adapted (every Table 1 and Table 3 encoder, the caption-text control), models/crossmodal (the MLM
            heads of the baselines and the caption control), models/pretrain_clip (CLIP-T), models/tokenizer, inputs/vicomte;
            CoDa and the reference encoder through the pins of hub.lock.json
    outs:   reports/probes.md, results/probes.json (metrics)

The rows (xdbert.analysis.probe_rows: every Table 1 and Table 3 encoder, CLIP-T, the reference and the caption-text
control, the cloze and CoDa only where a row has its own MLM head) and the study (xdbert.analysis.probes) are the
library's; this script reads the settings, checks the inputs, calls the study and writes its results and report.

With `probes.enabled: false` (the embedded and micro profiles) it writes a short report saying the probes are off,
and nothing else, as the mechanism stage does when its study is off.
"""
from __future__ import annotations

import os

from xdbert import io
from xdbert import params as P
from xdbert.analysis.probe_rows import Row, check_inputs, load_row, study_rows
from xdbert.data.probes import ProbesSettings, check_vicomte_files
from xdbert.paths import PROBES_METRICS, report
from xdbert.stage import run

TITLE = "Visual-knowledge probes: ViComTe and CoDa"


def read(p: dict) -> tuple[str, ProbesSettings, list[Row]]:
    """(profile, settings, the rows: none when the probes are off): every param this stage reads, checked;
    tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    s = ProbesSettings.from_params(p)
    return p["profile"], s, study_rows(p, s.reference) if s.enabled else []


def main() -> None:
    profile, s, rows = read(P.load())
    from xdbert.reports.header import header

    if not s.enabled:
        io.write_json(PROBES_METRICS, {"profile": profile, "enabled": False})
        io.write_text(report("probes"), header(TITLE, profile, "-")
                      + "\nThe probes are off (`probes.enabled: false`): no probe was run.\n")
        return
    from xdbert.analysis.probes import probe
    from xdbert.data.coda import load_coda
    from xdbert.data.vicomte import load_coda_templates, load_relation
    from xdbert.reports.probes import render

    check_vicomte_files(s)  # the hand-provided files first: a bad line fails before any model loads
    check_inputs(rows)
    relations = {r: load_relation(s.vicomte_dir, r) for r in s.relations}
    coda, coda_templates = load_coda(s.coda_hub_id), load_coda_templates(s.vicomte_dir)
    jobs = len(os.sched_getaffinity(0))
    results = probe(rows, load_row, relations, coda, coda_templates, cv_folds=s.cv_folds, n_boot=s.n_boot, jobs=jobs,
                    say=lambda line: print(line, flush=True))
    results["profile"] = profile
    io.write_json(PROBES_METRICS, results)
    io.write_text(report("probes"), render(results))


if __name__ == "__main__":
    run(main)
