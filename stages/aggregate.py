"""Stage `aggregate`: medians over seeds into reports/table1.md, table3.md and table8.md.

Reads every finetune run's dev predictions (results/finetune/<task>/<run>/predictions.parquet; runs are
the encoder names, `full_<variant>` for the whole cross-modal model and `clip_t` for CLIP's tower alone),
and for Table 3 each variant's adaptation metrics (metrics/adapt/<variant>.json).
"""
from xdbert import io, params, paths
from xdbert.stage import run


def main() -> None:
    from xdbert.reports.settings import AggregateSettings

    settings = AggregateSettings.from_params(params.load())

    from xdbert.reports.tables import render, results_csv, tables_metrics  # pandas, scikit-learn: after the checks

    reports, results = render(settings, paths.FINETUNE, paths.ADAPT_METRICS)
    for name, text in reports.items():
        io.write_text(paths.report(name), text)
    io.write_json(paths.AGGREGATE_JSON, results)
    io.write_text(paths.AGGREGATE_CSV, results_csv(results))
    io.write_json(paths.TABLES_METRICS, tables_metrics(results))
    print("aggregate: wrote reports/table1.md, table3.md, table8.md")


if __name__ == "__main__":
    run(main)
