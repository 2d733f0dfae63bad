"""1. Data: everything the pipeline reads before a model exists.

- `corpus`: the adaptation corpus (wiki103 or generated), one row per whole document.
- `tasks`: the ten finetuning tasks in one normalized schema, and their metrics.
- `synthetic`: the embedded profile's generated corpus and task stand-ins.
- `tokenization`, `shards`: the dual (BERT + CLIP) tokenization of the corpus into Arrow shards.
- `provided`: the hand-provided files, checked before any work; `vicomte`, `coda`, `probes`: the visual-knowledge
  probes' data (ViComTe's files, CoDa) and their params section.
"""
