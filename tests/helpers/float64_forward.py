"""The outside reference for the random-weight models of vocab_models.py: the first window of a
base file scored by a float64 forward of the same weights (transformers' modules, the
log-softmax and gather in numpy float64), and that log-softmax."""

from __future__ import annotations

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
    # The experts' grouped matrix products take no float64: the mixtures run them one expert at a time.
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.inference_mode():
        logits = m(input_ids=torch.from_numpy(np.asarray(w.tokens, np.int64))[None]).logits[0].numpy()
    logp = log_softmax(logits[w.first : w.first + w.n_scored])
    return -logp[np.arange(w.n_scored), np.asarray(w.targets, np.int64)]


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Each row's log-probabilities, in float64."""
    x = np.asarray(rows, np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
