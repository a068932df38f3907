"""The reducer: compared logits + base rows -> a handful of numbers per scored token.

Entry point: ``reduce_base`` (a base file's rows as its header describes them) and
``reduce_rows`` (full rows), which pick a backend for the logits' device (``reducer_for``):
``triton_kernel`` on CUDA, ``numba_cpu`` on the CPU, ``torch_ops`` anywhere; ``topk`` for
compact rows. Every backend returns ``TokenRecords`` (``records``); only those leave the device.

The arithmetic follows llama-perplexity's ``log_softmax`` (docs/llama-perplexity-format.md §5): float32 terms,
float64 sums, KLD over the base entries whose decoded log-prob exceeds -16 (the file's -clamp
when kldtool's container stores a wider window), base probabilities not renormalized,
first-index argmax. Beyond llama.cpp's five records the same pass yields reverse KLD, JSD,
total variation, top-5/10 overlap and the base's top-1 probability (``docs/metrics.md``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading

import numpy as np

from kldtool.reduce.records import FIELDS, PendingRecords, TokenRecords, on_host, to_records
from kldtool.reduce.rowmath import CLAMPED_AT, TOP_K

__all__ = [
    "FIELDS",
    "CLAMPED_AT",
    "TOP_K",
    "PendingRecords",
    "TokenRecords",
    "reduce_base",
    "reduce_rows",
    "reducer_for",
    "on_host",
    "warm_up",
]


def reduce_base(logits, base_rows, targets, header, defer: bool = False) -> TokenRecords:
    """Reduce against a base file's rows as its header (``keep``, ``clamped_at``) describes them:
    full rows, or top-K records. Logits and rows are both torch tensors, or both numpy arrays
    (a host engine's logits, uint16 rows). ``defer``: a GPU's records may come back pending
    (records.PendingRecords), their computation queued."""
    if header.keep:
        from kldtool.codec.rows import rows_to_torch
        from kldtool.reduce.topk_rows import reduce_topk_rows

        if isinstance(logits, np.ndarray):
            logits, base_rows = _torch(logits), rows_to_torch(base_rows)
        return reduce_topk_rows(logits, base_rows, targets, header.keep, header.clamped_at)
    return reduce_rows(logits, base_rows, targets, header.clamped_at, defer)


def reduce_rows(logits, base_rows, targets, clamped_at: float = CLAMPED_AT, defer: bool = False) -> TokenRecords:
    """Reduce compared logits (R, V) against base rows (R, NV: int16 tensors, or uint16 arrays
    beside numpy logits) for target ids (R,); base entries at or below ``clamped_at`` (the file's -clamp, -16 in llama.cpp's layout) count as clamped."""
    # Backends load on first use: numba compiles and Triton needs CUDA, and neither is needed
    # by a process that only writes base files. Host engines hand numpy arrays, which reach
    # the numba loop without torch (whose import alone is a large part of a short llama.cpp compare).
    host = isinstance(logits, np.ndarray)
    kind = reducer_for(None if host else logits.device)
    if not host and str(logits.dtype) == "torch.float64":
        kind = "torch"  # the compiled reducers are float32; float64 logits get the float64 reduction
    if kind == "numba":
        from kldtool.reduce.numba_cpu import reduce_rows_cpu

        if not host:
            logits, base_rows = logits.to("cpu").float().numpy(), base_rows.cpu().numpy()
        return to_records(
            reduce_rows_cpu(np.asarray(logits, np.float32), base_rows, np.asarray(targets, np.int64), clamped_at)
        )
    if host:
        from kldtool.codec.rows import rows_to_torch

        logits, base_rows = _torch(logits), rows_to_torch(base_rows)
    if kind == "triton":
        from kldtool.reduce.triton_records import triton_records

        return triton_records(logits, base_rows, targets, clamped_at, defer)
    from kldtool.reduce.torch_ops import reduce_rows_torch

    return reduce_rows_torch(logits, base_rows, targets, clamped_at)


def reducer_for(device) -> str:
    """Which reducer runs on ``device``: the one-pass Triton kernel on CUDA when Triton is
    installed, the compiled numba loop on the CPU, else the torch ops.
    ``KLDTOOL_REDUCER=torch|numba|triton`` forces one (triton on the CPU needs
    ``TRITON_INTERPRET=1``: tests only). ``device`` is a torch device, an engine's device
    name ("cuda:1"), or None for the host."""
    choice = os.environ.get("KLDTOOL_REDUCER", "auto")
    if choice in ("torch", "numba", "triton"):
        return choice
    kind = getattr(device, "type", None) or str(device or "cpu").partition(":")[0]
    if kind == "cuda":
        return "triton" if _installed("triton") else "torch"
    return "numba" if _installed("numba") else "torch"


def warm_up(device, one_core: bool = False, all_cores: bool = True) -> None:
    """Load the CPU reducer's compiled loops a run's calls use (on one core each, on every
    core: an engine's schedule says which) on a thread while the engine computes its first
    batch, instead of after it (numba's import and its disk cache); a no-op elsewhere."""
    if reducer_for(device) == "numba":
        threading.Thread(
            target=_load_numba, args=(one_core, all_cores), name="kldtool-reducer-warm-up", daemon=True
        ).start()


def _load_numba(one_core: bool, all_cores: bool) -> None:
    try:
        from kldtool.reduce.numba_cpu import warm

        warm(one_core, all_cores)
    except Exception:  # the first real reduction meets the same error and reports it
        pass


def _torch(array):
    import torch

    return torch.from_numpy(array)


@functools.cache
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
