"""The embedded profile's generated data: a corpus and ten task stand-ins from one vocabulary.

- `words`: the word lists and the helpers every generator shares.
- `documents`: the generated adaptation corpus (`generate_corpus`).
- `events`: events (who did what to which object where) and how sentences state them.
- `glue`, `swag`, `read`: the task generators, one `gen_<task>(rng, label)` per task.
- `tasks`: `generate_task`, balanced labels and deduplicated splits.
"""
