"""The outside reference for the random-weight models of vocab_models.py: the first window of a
base file scored by a float64 forward of the same weights (transformers' modules, the
log-softmax and gather in numpy float64), and that log-softmax. A window's NLL is kept per
machine, keyed by the model directory's files and the window's tokens: test_vocabularies.py and
test_vllm_engine.py ask for the same windows of the same shapes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np


def first_window_nll(model: str, base) -> np.ndarray:
    """NLL of the first window's scored targets of the base file ``base`` under ``model`` in float64."""
    import torch
    from transformers import AutoModelForCausalLM

    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.compat import base_windows

    reader = open_base_file(str(base))
    w = base_windows(reader, reader.metadata["protocol"].get("bos_id"))[0]
    reader.close()
    kept = _kept(model, w)
    if kept.exists():
        return np.load(kept)
    # The experts' grouped matrix products take no float64: the mixtures run them one expert at a time.
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.inference_mode():
        logits = m(input_ids=torch.from_numpy(np.asarray(w.tokens, np.int64))[None]).logits[0].numpy()
    logp = log_softmax(logits[w.first : w.first + w.n_scored])
    nll = -logp[np.arange(w.n_scored), np.asarray(w.targets, np.int64)]
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.npy")
    np.save(tmp, nll)
    os.replace(tmp, kept)  # whole or not at all: two workers may race to the same key
    return nll


def _kept(model: str, window) -> Path:
    """Where the float64 NLL of ``window`` under ``model`` is kept: named by the digest of every
    file of the model directory (name, size, modification time) and of the window itself."""
    from kldtool.engines.defaults import cache_dir

    h = hashlib.sha256()
    root = Path(model).resolve()
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            st = f.stat()
            h.update(f"{f.relative_to(root)} {st.st_size} {st.st_mtime_ns}\n".encode())
    h.update(
        repr((list(map(int, window.tokens)), window.first, window.n_scored, list(map(int, window.targets)))).encode()
    )
    d = cache_dir() / "float64-nll"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{h.hexdigest()[:32]}.npy"


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Each row's log-probabilities, in float64."""
    x = np.asarray(rows, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
