"""A model as the user named it (``-m``): a local directory or file, a hub id (``org/name``, at
``--revision``), or a GGUF inside a hub repository (``org/name:file.gguf`` or ``--gguf-file``).

Hub ids resolve through huggingface_hub's cache, offline when ``HF_HUB_OFFLINE=1``, so every
engine loads a local path and the run records exactly which snapshot it read. A local model is
recorded by its path and a hash of what identifies its contents cheaply: its config and weight
index for a directory, its header for a GGUF.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass

from kldtool.errors import EngineError, UsageError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a transformers or vLLM load reads; a repository's other formats (.bin, .gguf, .pt) are not fetched.
DIRECTORY_FILES = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
_GGUF_HEAD_BYTES = 16 << 20  # a GGUF's metadata and tensor table come first; 16 MiB covers a 262k vocabulary's


@dataclass(kw_only=True, frozen=True)
class ModelRef:
    given: str  # as the user typed it
    path: str  # the local directory or file an engine loads
    hub_id: str | None = None
    revision: str | None = None
    snapshot: str | None = None  # the commit the revision resolved to
    file: str | None = None  # a GGUF inside the repository

    def record(self) -> dict:
        """What results, base files and manifests record of where the model came from."""
        if self.hub_id:
            out = {"hub_id": self.hub_id, "revision": self.revision or "main", "snapshot": self.snapshot}
            return out | ({"file": self.file} if self.file else {})
        return {"path": os.path.abspath(self.path), "content_sha256": content_hash(self.path)}


def is_hub_id(model: str) -> bool:
    name = model.split(":", 1)[0]
    return bool(_HUB_ID.match(name)) and not os.path.exists(name)


def local_path(name: str, cached_only: bool = False) -> str:
    """``name`` itself unless it is a hub id that is not a path here; then the cache's copy
    (with ``cached_only``, never fetched: an error if the cache has none)."""
    if os.path.exists(name) or not is_hub_id(name):
        return name
    return resolve(name, cached_only=cached_only).path


@functools.lru_cache(maxsize=16)  # start_loading and make_engine both ask; a hub lookup may take a round trip
def resolve(
    model: str, revision: str | None = None, gguf_file: str | None = None, cached_only: bool = False
) -> ModelRef:
    """The local path behind ``model``; a one-line error naming what was tried if there is none."""
    if os.path.exists(model):
        if revision or gguf_file:
            flag = "--revision" if revision else "--gguf-file"
            raise UsageError(f"{flag}: only with a hub id (org/name); {model} is a local path")
        return ModelRef(given=model, path=model)
    name, _, in_repo = model.partition(":")
    if not _HUB_ID.match(name):
        raise EngineError(f"{model}: no such file or directory, and not a hub id (org/name)")
    if in_repo and gguf_file and in_repo != gguf_file:
        raise UsageError(f"--gguf-file {gguf_file}: {model} already names {in_repo}")
    file = in_repo or gguf_file
    return _from_hub(model, name, revision, file, cached_only)


def _from_hub(given: str, hub_id: str, revision: str | None, file: str | None, cached_only: bool) -> ModelRef:
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise EngineError(f"{given}: a hub id needs huggingface_hub (pip install huggingface_hub)") from None
    offline = constants.HF_HUB_OFFLINE or cached_only
    try:
        if file:
            path = huggingface_hub.hf_hub_download(hub_id, file, revision=revision, local_files_only=offline)
            snapshot_dir = path[: -len(file)].rstrip("/")
        else:
            path = snapshot_dir = huggingface_hub.snapshot_download(
                hub_id, revision=revision, allow_patterns=DIRECTORY_FILES, local_files_only=offline
            )
    except Exception as e:  # huggingface_hub raises its own errors, OSError and the HTTP client's
        raise EngineError(_not_found(given, hub_id, revision, file, e, constants)) from None
    return ModelRef(
        given=given, path=path, hub_id=hub_id, revision=revision, snapshot=os.path.basename(snapshot_dir), file=file
    )


def _not_found(given: str, hub_id: str, revision: str | None, file: str | None, e: Exception, constants) -> str:
    repo = os.path.join(constants.HF_HUB_CACHE, "models--" + hub_id.replace("/", "--"))
    if not os.path.isdir(repo):
        cached = f"the hub cache {constants.HF_HUB_CACHE} has no {hub_id}"
    elif revision and not _cached_revision(repo, revision):
        cached = f"the hub cache has {hub_id} but not its revision {revision}"
    elif file:
        cached = f"the hub cache's {hub_id}@{revision or 'main'} has no {file}"
    else:
        cached = f"the hub cache's {hub_id} has no snapshot for {revision or 'main'}"
    if constants.HF_HUB_OFFLINE:
        network = "the network is off (HF_HUB_OFFLINE=1)"
    else:
        network = f"the hub answered: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return f"{given}: no such model (not a local path; {cached}; {network})"


def _cached_revision(repo: str, revision: str) -> bool:
    return os.path.isfile(os.path.join(repo, "refs", revision)) or os.path.isdir(
        os.path.join(repo, "snapshots", revision)
    )


def content_hash(path: str) -> str:
    """sha256 of a local model's config and weight index (a directory: config.json, the weight
    index if any, each weight file's name and size) or of a GGUF's size and header."""
    h = hashlib.sha256()
    if os.path.isdir(path):
        for name in ("config.json", "model.safetensors.index.json"):
            p = os.path.join(path, name)
            if os.path.isfile(p):
                h.update(name.encode() + b"\0")
                with open(p, "rb") as f:
                    h.update(f.read())
        weights = sorted(n for n in os.listdir(path) if n.endswith(_WEIGHT_SUFFIXES))
        h.update(json.dumps([[n, os.path.getsize(os.path.join(path, n))] for n in weights]).encode())
    else:
        h.update(str(os.path.getsize(path)).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read(_GGUF_HEAD_BYTES))
    return h.hexdigest()
