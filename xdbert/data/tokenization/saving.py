"""Writing a tokenizer folder whose bytes say what the tokenizer is, not how it was loaded.

transformers keeps in a loaded tokenizer's `init_kwargs` how `from_pretrained` was called, and `save_pretrained`
writes it back into tokenizer_config.json: `local_files_only` is true wherever HF_HUB_OFFLINE=1 is set, and
`is_local` says whether a folder or a hub id was read. Kept, one environment variable would change a saved
folder's bytes and so every stage after it. A module of its own, outside what a finetuning run computes
(xdbert.finetuning.compute.keys), so that saving changes no run's key.
"""
from __future__ import annotations

from pathlib import Path

LOAD_ARGUMENTS = ("is_local", "local_files_only")


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    """`tokenizer.save_pretrained(folder)` without the arguments it was loaded with (dropped from the tokenizer
    too): the same tokenizer writes the same bytes in every environment."""
    for key in LOAD_ARGUMENTS:
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(str(folder))
