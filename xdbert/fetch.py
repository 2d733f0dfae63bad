"""`xdbert fetch`: download every hub asset the current params name, and pin each one's revision.

A GPU machine often has no internet. On a machine that has, `xdbert fetch` resolves each model and
dataset the profile names to the commit the hub serves today (or to the revision `hub.revisions` asks
for), downloads that snapshot into the standard hub cache, and writes the commits to hub.lock.json,
which is committed. Every loader then reads the pinned snapshot from the cache (`xdbert.hub.source`),
so copying the cache to the GPU machine lets `dvc repro` run there offline, on exactly those files, and
a teammate who fetches next month gets the same ones. Nothing is pinned that was not resolved: the
commits come from the hub, never from this code.

Of a model repository's weights, `fetch` downloads only the file its loader reads: the first of the loader's
own preference list (safetensors, then `.bin`) that the repository holds at the pinned commit.

Files a user provides by hand (CommonLit's train.csv, COCO's captions, ViComTe's files) are not on the hub: `fetch`
checks that they are there and readable (xdbert.data.provided), before anything is downloaded. After the
downloads, every asset is loaded once the way its stage loads it (xdbert.fetch_check); the lock keeps its
old bytes unless every check passes.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xdbert import io
from xdbert import params as P
from xdbert.data import provided
from xdbert.data.probes import ProbesSettings, vicomte_files
from xdbert.errors import PipelineError
from xdbert.hub import LOCK, hub_request
from xdbert.random_encoder import RANDOM_PREFIX

# What a model repository holds that no loader here reads: other frameworks' weights and exports.
MODEL_IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.tflite", "onnx/*", "coreml/*", "openvino/*", "rust_model*"]
# PyTorch weights files: of these, a model repository's download keeps only the one its loader reads (`Asset.weights`).
WEIGHTS = ["*.safetensors", "*.bin", "*.pt", "*.pth"]


@dataclass(frozen=True)
class Asset:
    """One hub repository the params name: `key` is the param that names it."""

    key: str
    repo_id: str
    repo_type: str                      # model | dataset
    revision: str | None = None         # what `hub.revisions` asks for; None = the hub's current one
    weights: tuple[str, ...] = ()       # a model's weights files, in its loader's order of preference


def _is_hub_id(name: str) -> bool:
    return bool(name) and not name.startswith(RANDOM_PREFIX) and not Path(name).exists()


def encoder_weights() -> tuple[str, ...]:
    """The weights files transformers' `from_pretrained` reads, in its order of preference."""
    from transformers.utils import SAFE_WEIGHTS_NAME, WEIGHTS_NAME

    return SAFE_WEIGHTS_NAME, WEIGHTS_NAME


def clip_weights(name: str, pretrained: str) -> tuple[str, ...]:
    """The checkpoint files of open_clip's `name`/`pretrained` in the order `xdbert.clip.pinned_clip_weights` tries
    them: the safetensors file open_clip prefers, then the configured one (tests/test_fetch_check.py holds the two
    together)."""
    import open_clip

    filename = os.path.split(open_clip.get_pretrained_cfg(name, pretrained)["hf_hub"])[1] or "open_clip_pytorch_model.bin"
    safe = ("open_clip_model.safetensors" if filename == "open_clip_pytorch_model.bin"
            else os.path.splitext(filename)[0] + ".safetensors")
    return safe, filename


HUB_KEYS = ("revisions",)  # the `hub` section's (read by `xdbert fetch` alone: a stage reads the pins it writes)


def requested_revisions(p: dict) -> dict[str, str]:
    """`hub.revisions`, checked: hub id -> branch, tag or commit."""
    revisions = P.get(P.section(p, "hub", HUB_KEYS), "revisions", "hub")
    if not isinstance(revisions, dict) or any(not isinstance(k, str) or not isinstance(v, str) or not v.strip()
                                              for k, v in revisions.items()):
        raise PipelineError(f"`hub.revisions` must map hub ids to a branch, tag or commit, e.g. "
                            f"{{bert-base-uncased: main}}, or be {{}}; got {revisions!r}")
    return revisions


def provided_files(p: dict) -> list[tuple[str, Path]]:
    """(param, path) of every file params `p` expect a user to have put in place: the first stages' (CommonLit's,
    COCO's) and ViComTe's, which the probes stage checks."""
    return provided.files(p) + vicomte_files(ProbesSettings.from_params(p))


def hub_assets(p: dict) -> list[Asset]:
    """Every hub repository the params `p` load from, in stage order, each once."""
    from xdbert.clip import clip_weights_repo  # open_clip: only when the assets are listed

    revisions = requested_revisions(p)
    model, corpus, tasks, families, grounding = (P.section(p, k) for k in ("model", "corpus", "tasks", "families", "grounding"))
    named: list[tuple[str, str, str]] = []  # (param, hub id, repo type)
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
    probes = P.section(p, "probes")
    if probes["enabled"]:
        named += [("probes.coda_hub_id", probes["coda_hub_id"], "dataset"), ("probes.reference", probes["reference"], "model")]
    out, seen = [], set()
    for key, name, kind in named:
        if _is_hub_id(name) and (name, kind) not in seen:
            seen.add((name, kind))
            weights = () if kind == "dataset" else (
                clip_weights(model["clip"], model["clip_pretrained"]) if key == "model.clip_pretrained" else encoder_weights())
            out.append(Asset(key, name, kind, revisions.get(name), weights))
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


def wanted_files(asset: Asset, files: list[str]) -> list[str]:
    """Of model repository `asset`'s `files`, those its loader reads: every file but other frameworks' and the
    weights, and of the weights the first of `asset.weights` the repository holds."""
    chosen = next((f for f in asset.weights if f in files), None)
    if chosen is None:
        raise PipelineError(f"model `{asset.repo_id}` (`{asset.key}`) holds none of the weights files its loader reads "
                            f"({', '.join(asset.weights)}); it has: {', '.join(files)}")
    skipped = MODEL_IGNORE + WEIGHTS
    return [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in skipped)] + [chosen]


def download(asset: Asset, revision: str) -> str:
    """The snapshot of `asset` at commit `revision`, downloaded into the hub cache: its local folder. A model
    repository: only the files its loader reads (`wanted_files`)."""
    from huggingface_hub import HfApi, snapshot_download

    allow = None
    if asset.repo_type == "model":
        allow = wanted_files(asset, HfApi().list_repo_files(asset.repo_id, repo_type="model", revision=revision))
    return snapshot_download(asset.repo_id, repo_type=asset.repo_type, revision=revision, allow_patterns=allow)


def fetch(p: dict, *, check: Callable[[dict, Callable[[str], None]], object], lock: Path = LOCK,
          resolve: Callable[[Asset], str] = current_revision, get: Callable[[Asset, str], str] = download,
          say: Callable[[str], None] = print) -> list[dict]:
    """Resolve, download and pin every hub asset of params `p`; write `lock`, then `check(p, say)` loads every
    asset the way its stage does (`xdbert fetch` passes xdbert.fetch_check.check_assets, which imports this
    module). A failed download or check leaves the old lock's bytes. Returns the lock's entries."""
    provided.check_files(provided_files(p))
    entries = []
    for asset in hub_assets(p):
        with hub_request(f"{asset.repo_type} `{asset.repo_id}` (`{asset.key}`)"):
            revision = resolve(asset)
            folder = get(asset, revision)
        files = sorted(str(f.relative_to(folder)) for f in Path(folder).rglob("*") if f.is_file())
        say(f"{asset.key}: {asset.repo_type} {asset.repo_id} @ {revision} ({len(files)} files)")
        entries.append({"key": asset.key, "repo_id": asset.repo_id, "repo_type": asset.repo_type,
                        "requested": asset.revision, "revision": revision, "files": files})
    old = lock.read_bytes() if lock.is_file() else None
    io.write_json(lock, {"profile": p["profile"], "assets": entries})  # the loaders read the new pins from it
    try:
        check(p, say)
    except BaseException:
        if old is None:
            lock.unlink()
        else:
            with io.atomic_path(lock) as tmp:
                tmp.write_bytes(old)
        raise
    say(f"{lock}: {len(entries)} assets pinned; commit it, and copy the hub cache to machines without internet")
    return entries
