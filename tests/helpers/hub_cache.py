"""A Hugging Face hub cache built from the built-in model, as `huggingface_hub` lays one out
($HF_HOME/hub/models--ORG--NAME/ with refs/REVISION naming a commit and snapshots/COMMIT/
holding the files), so hub ids resolve with HF_HUB_OFFLINE=1 and nothing is downloaded.

The snapshot files are symbolic links, as in a real cache (there into blobs/; here to the
built-in model's files, which keeps the cache small and lets engines keyed by the weights'
real path be shared).
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL = "someorg/smol"  # the fp32 checkpoint: main and the tag v2, two snapshots of the same files
GGUF_REPO = "someorg/smol-gguf"  # the Q4_1 GGUF
SNAPSHOTS = {"main": "1" * 40, "v2": "2" * 40}
GGUF_SNAPSHOT = "3" * 40


def _repo(hub: Path, hub_id: str, refs: dict[str, str], files: list[str]) -> None:
    repo = hub / ("models--" + hub_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (repo / "refs" / ref).write_text(commit)
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for f in files:
            link = snap / os.path.basename(f)
            if not link.exists():
                link.symlink_to(f)


def make_hub_cache(home: Path, checkpoint_dir: str, gguf: str) -> dict:
    """Build the cache under ``home``; returns the environment that points the hub there, offline."""
    hub = home / "hub"
    files = sorted(str(p) for p in Path(checkpoint_dir).iterdir() if p.is_file() and not p.name.startswith("."))
    _repo(hub, MODEL, SNAPSHOTS, files)
    _repo(hub, GGUF_REPO, {"main": GGUF_SNAPSHOT}, [gguf])
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
