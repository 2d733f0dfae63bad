"""The reports: the paper's result tables from the finetune runs, and the header every report starts with.

    header.py     title, profile, models and seeds of a report
    aggregate.py  seed statistics: a table cell per (model, task), the paired bootstrap against the baseline
    settings.py   `AggregateSettings`: what the `aggregate` stage reads of params.yaml
    tables.py     Tables 1, 3 and 8 as markdown (beside the paper's numbers) and as data
    headline.py   metrics/headline.json: each table's mean Δ and the mechanism gates, what `xdbert compare` shows
    parameters.py Table 6: the parameters of the models the adaptations built
    probes.py     reports/probes.md: the visual-knowledge probes (ViComTe, CoDa) beside the published figures
"""
