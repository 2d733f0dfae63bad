"""Stage `aggregate`: medians over seeds into reports/table1.md, table3.md and table8.md; reports/table6.md.

Reads every finetune run's dev predictions (results/finetune/<task>/<run>/predictions.parquet; runs are
`<family>/<model>` for the adapted encoders, `<family>/full_<model>` for a family's whole cross-modal model
and `clip_t` for CLIP's tower alone) and the adaptation metrics (metrics/adapt/<family>/<variant>.json):
Table 3's variants of `adapt.family`, and the MLM head each family's `xdbert` adaptation started from and the
parameters of the model it built (Table 6). When the mechanism study is on, results/mechanism.json gives the
line under Table 1 on its gates.
Tables 1 and 8 have rows for every family of `families`, each Δ against that family's own baseline.
Writes metrics/headline.json (xdbert.reports.headline), the few numbers `xdbert compare` puts side by side,
and metrics/tables.json, every cell of Tables 1, 3 and 8 for `dvc metrics diff --targets metrics/tables.json`.
"""
from xdbert import io, params, paths
from xdbert.stage import run


def read(p: dict):
    """(settings, whether the mechanism study is on): every param this stage reads, checked;
    tools/dvc_yaml.py records them for its `params:` in dvc.yaml."""
    from xdbert.data.mechanism import study_on
    from xdbert.reports.settings import AggregateSettings

    return AggregateSettings.from_params(p), study_on(p)


def main() -> None:
    settings, mechanism_on = read(params.load())
    # the line under Table 1 on the mechanism study's gates
    mechanism = io.read_json(paths.MECHANISM_METRICS) if mechanism_on else None

    # pandas, scikit-learn: after the checks
    from xdbert.reports.headline import headline
    from xdbert.reports.parameters import table6
    from xdbert.reports.tables import render, results_csv, tables_metrics

    reports, results = render(settings, paths.FINETUNE, paths.ADAPT_METRICS, mechanism)
    reports["table6"] = table6(settings, paths.ADAPT_METRICS)
    for name, text in reports.items():
        io.write_text(paths.report(name), text)
    io.write_json(paths.AGGREGATE_JSON, results)
    io.write_text(paths.AGGREGATE_CSV, results_csv(results))
    io.write_json(paths.TABLES_METRICS, tables_metrics(results))
    io.write_json(paths.HEADLINE, headline(results, mechanism))
    print(f"aggregate: wrote reports/table1.md, table3.md, table6.md, table8.md and {paths.HEADLINE}")


if __name__ == "__main__":
    run(main)
