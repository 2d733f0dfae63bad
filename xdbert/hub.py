"""Loading from the Hugging Face hub: one clear message when the machine is offline, the revisions
`xdbert fetch` pinned in hub.lock.json, and loading without the libraries' chatter."""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Iterator

from xdbert.errors import PipelineError

OFFLINE_HINT = (
    "this machine cannot reach the hub. Either switch to the offline profile (`xdbert profile embedded`), "
    "or download on a connected machine first (it lands in ~/.cache/huggingface) and set HF_HUB_OFFLINE=1"
)
NOT_CACHED_HINT = (
    "it is not in this machine's hub cache, and the hub is switched off (HF_HUB_OFFLINE=1). Check that the id is "
    "spelled right, or run `xdbert fetch` where the hub can be reached and copy its cache (HF_HOME, "
    "~/.cache/huggingface) here"
)


def _is_network_error(e: BaseException) -> bool:
    names = {type(c).__name__ for c in _chain(e)}
    network = {
        "ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "OfflineModeIsEnabled",
        "LocalEntryNotFoundError", "MaxRetryError", "NameResolutionError", "gaierror",
    }
    if names & network:
        return True
    text = " ".join(str(c) for c in _chain(e)).lower()
    return any(s in text for s in ("offline", "couldn't connect", "connection", "name resolution", "network"))


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


@contextlib.contextmanager
def hub_request(what: str) -> Iterator[None]:
    """Wrap a hub download of `what`; a network failure becomes a `PipelineError` saying what to do."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as e:  # the hub libraries raise many types for the same offline condition
        if _is_network_error(e):
            from huggingface_hub import constants

            hint = NOT_CACHED_HINT if constants.HF_HUB_OFFLINE else OFFLINE_HINT
            raise PipelineError(f"could not load {what}: {hint}") from e
        raise


@contextlib.contextmanager
def hub_config_errors(section: str, hub_id: str, config: str | None) -> Iterator[None]:
    """Turn `datasets`' "BuilderConfig 'x' not found" into a PipelineError naming the params to fix."""
    try:
        yield
    except ValueError as e:
        if "BuilderConfig" in str(e):
            raise PipelineError(f"`{hub_id}` has no config {config!r} (check the `{section}` params): {e}") from e
        raise


# ----------------------------------------------------------------------------------------------------
# Pinned revisions: hub.lock.json, written by `xdbert fetch` (xdbert.fetch), read by every loader
# ----------------------------------------------------------------------------------------------------

LOCK = Path("hub.lock.json")


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Build or load models without the reports that this code checks or expects itself: transformers'
    load report and progress bars (missing encoder weights raise in `build_language_encoder`; a new task
    head is the point of finetuning), and open_clip's "initialized randomly" for towers asked for
    without weights, whose trained weights are loaded next. Outside these loads, logging is as before."""
    from transformers.utils import logging as hf_logging

    verbosity, bars, disabled = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), logging.root.manager.disable
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.disable(logging.WARNING)  # open_clip warns on the root logger
    try:
        yield
    finally:
        logging.disable(disabled)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def pinned(repo_id: str, repo_type: str = "model", lock: Path = LOCK) -> str | None:
    """The commit `lock` pins hub repository `repo_id` at, or None where it pins nothing."""
    if not lock.is_file():
        return None
    try:
        written = json.loads(lock.read_text(encoding="utf-8"))
    except ValueError:  # not JSON, or not even UTF-8 text
        written = None
    assets = written.get("assets") if isinstance(written, dict) else None
    keys = {"repo_id", "repo_type", "revision"}
    if not isinstance(assets, list) or not all(isinstance(e, dict) and keys <= set(e) for e in assets):
        raise PipelineError(f"{lock} is not a hub lock (an `assets` list of {', '.join(sorted(keys))} entries): "
                            f"restore it with `git checkout {lock}`, or write it again with `xdbert fetch`")
    for entry in assets:
        if entry["repo_id"] == repo_id and entry["repo_type"] == repo_type:
            return entry["revision"]
    return None


def source(name: str, repo_type: str = "model", lock: Path = LOCK) -> str:
    """What a loader reads for `name`: a local folder as it is; a hub id the lock pins, its snapshot at that
    commit in the hub cache (so a run loads what `xdbert fetch` downloaded, with or without a network);
    any other hub id unchanged (the hub's current revision)."""
    if Path(name).exists():
        return name
    revision = pinned(name, repo_type, lock)
    if revision is None:
        print(f"note: {repo_type} `{name}` is not pinned in {lock}: loading what the hub serves today; "
              f"`xdbert fetch` pins it")
        return name
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, repo_type=repo_type, revision=revision, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError and kin: the snapshot is not in this machine's cache
        raise PipelineError(
            f"{repo_type} `{name}` at revision {revision} ({lock}) is not in this machine's hub cache: run `xdbert fetch` "
            f"where the hub can be reached, and copy its cache (HF_HOME, ~/.cache/huggingface) here") from e
