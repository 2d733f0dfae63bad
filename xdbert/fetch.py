"""`xdbert fetch`: download every hub asset the current params name, and pin each one's revision.

A GPU machine often has no internet. On a machine that has, `xdbert fetch` resolves each model and
dataset the profile names to the commit the hub serves today (or to the revision `hub.revisions` asks
for), downloads that snapshot into the standard hub cache, and writes the commits to hub.lock.json,
which is committed. Every loader then reads the pinned snapshot from the cache (`xdbert.hub.source`),
so copying the cache to the GPU machine lets `dvc repro` run there offline, on exactly those files, and
a teammate who fetches next month gets the same ones. Nothing is pinned that was not resolved: the
commits come from the hub, never from this code.

Files a user provides by hand (CommonLit's train.csv, COCO's captions) are not on the hub: `fetch`
checks that they are there and readable (xdbert.data.provided), before anything is downloaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xdbert import io
from xdbert import params as P
from xdbert.data import provided
from xdbert.errors import PipelineError
from xdbert.hub import LOCK, hub_request
from xdbert.random_encoder import RANDOM_PREFIX

# What a model repository holds that no loader here reads: other frameworks' weights and exports.
MODEL_IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.tflite", "onnx/*", "coreml/*", "openvino/*", "rust_model*"]


@dataclass(frozen=True)
class Asset:
    """One hub repository the params name: `key` is the param that names it."""

    key: str
    repo_id: str
    repo_type: str                      # model | dataset
    revision: str | None = None         # what `hub.revisions` asks for; None = the hub's current one


def _is_hub_id(name: str) -> bool:
    return bool(name) and not name.startswith(RANDOM_PREFIX) and not Path(name).exists()


def requested_revisions(p: dict) -> dict[str, str]:
    """`hub.revisions`, checked: hub id -> branch, tag or commit."""
    revisions = P.get(P.section(p, "hub"), "revisions", "hub")
    if not isinstance(revisions, dict) or any(not isinstance(k, str) or not isinstance(v, str) or not v.strip()
                                              for k, v in revisions.items()):
        raise PipelineError(f"`hub.revisions` must map hub ids to a branch, tag or commit, e.g. "
                            f"{{bert-base-uncased: main}}, or be {{}}; got {revisions!r}")
    return revisions


def hub_assets(p: dict) -> list[Asset]:
    """Every hub repository the params `p` load from, in stage order, each once."""
    from xdbert.clip import clip_weights_repo  # open_clip: only when the assets are listed

    revisions = requested_revisions(p)
    model, corpus, tasks, families, grounding = (P.section(p, k) for k in ("model", "corpus", "tasks", "families", "grounding"))
    named: list[tuple[str, str, str]] = []
    if corpus["source"] == "hub":
        named.append(("corpus.hub_id", corpus["hub_id"], "dataset"))
    if tasks["source"] == "hub":
        if set(tasks["names"]) - {"swag", "read"}:
            named.append(("tasks.glue_hub_id", tasks["glue_hub_id"], "dataset"))
        if "swag" in tasks["names"]:
            named.append(("tasks.swag_hub_id", tasks["swag_hub_id"], "dataset"))
        if "read" in tasks["names"] and not tasks["read_path"].endswith(".csv"):
            named.append(("tasks.read_path", tasks["read_path"], "dataset"))
    named.append(("model.encoder", model["encoder"], "model"))  # the tokenizer's, and every family's that names none
    named += [(f"families.{name}.encoder", entry["encoder"], "model") for name, entry in families.items() if "encoder" in entry]
    clip_repo = clip_weights_repo(model["clip"], model["clip_pretrained"])
    if clip_repo:
        named.append(("model.clip_pretrained", clip_repo, "model"))
    captions = grounding["captions"]
    if captions != "generated" and not captions.endswith(".json"):
        named.append(("grounding.captions", captions, "dataset"))
    out, seen = [], set()
    for key, name, kind in named:
        if _is_hub_id(name) and (name, kind) not in seen:
            seen.add((name, kind))
            out.append(Asset(key, name, kind, revisions.get(name)))
    unknown = sorted(set(revisions) - {a.repo_id for a in out})
    if unknown:
        raise PipelineError(f"`hub.revisions` names {unknown}, which these params do not load from the hub; "
                            f"they load: {', '.join(a.repo_id for a in out) or 'nothing'}")
    return out


def current_revision(asset: Asset) -> str:
    """The commit the hub serves for `asset` at its requested revision (the default branch if none)."""
    from huggingface_hub import HfApi

    info = HfApi().repo_info(asset.repo_id, repo_type=asset.repo_type, revision=asset.revision)
    return info.sha


def download(asset: Asset, revision: str) -> str:
    """The snapshot of `asset` at commit `revision`, downloaded into the hub cache: its local folder."""
    from huggingface_hub import snapshot_download

    ignore = MODEL_IGNORE if asset.repo_type == "model" else None
    return snapshot_download(asset.repo_id, repo_type=asset.repo_type, revision=revision, ignore_patterns=ignore)


def fetch(p: dict, lock: Path = LOCK, resolve: Callable[[Asset], str] = current_revision,
          get: Callable[[Asset, str], str] = download, say: Callable[[str], None] = print) -> list[dict]:
    """Resolve, download and pin every hub asset of params `p`; write `lock` (after every download
    succeeded, so a failed fetch leaves the old lock). Returns the lock's entries."""
    provided.check(p)
    entries = []
    for asset in hub_assets(p):
        with hub_request(f"{asset.repo_type} `{asset.repo_id}` (`{asset.key}`)"):
            revision = resolve(asset)
            folder = get(asset, revision)
        files = sorted(str(f.relative_to(folder)) for f in Path(folder).rglob("*") if f.is_file())
        say(f"{asset.key}: {asset.repo_type} {asset.repo_id} @ {revision} ({len(files)} files)")
        entries.append({"key": asset.key, "repo_id": asset.repo_id, "repo_type": asset.repo_type,
                        "requested": asset.revision, "revision": revision, "files": files})
    io.write_json(lock, {"profile": p["profile"], "assets": entries})
    say(f"{lock}: {len(entries)} assets pinned; commit it, and copy the hub cache to machines without internet")
    return entries
