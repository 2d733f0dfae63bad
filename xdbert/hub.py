"""Loading from the Hugging Face hub with one clear message when the machine is offline."""
from __future__ import annotations

import contextlib
from typing import Iterator

from xdbert.errors import PipelineError

OFFLINE_HINT = (
    "this machine cannot reach the hub. Either switch to the offline profile (`xdbert profile embedded`), "
    "or download on a connected machine first (it lands in ~/.cache/huggingface) and set HF_HUB_OFFLINE=1"
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
            raise PipelineError(f"could not load {what}: {OFFLINE_HINT}") from e
        raise
