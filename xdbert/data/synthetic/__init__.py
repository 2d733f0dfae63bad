"""The embedded profile's generated data: a corpus and ten task stand-ins from one vocabulary.

- `words`: the word lists, the helpers every generator shares, and the COCO-like scenes (`generate_captions`).
- `documents`: the generated adaptation corpus (`generate_corpus`).
- `events`: events (who did what to which object where) and how sentences state them.
- `glue`, `swag`, `read`: the task generators, one `gen_<task>(rng, label, objects)` per task.
- `tasks`: `generate_task`, balanced labels and deduplicated splits.
- `world`: the mechanism study's facts, captions and probe task `vis`.
"""
