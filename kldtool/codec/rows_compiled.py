"""encode_np's rows from compiled loops (numba), for the logits a host replays from hidden
states (logitsfile/hidden.py), where numpy's ten passes over each row cost more than the
replay's own product: here two passes (max, min and the float64 sum of exponentials; then the
codes), rows in parallel (or, on a lane's thread, on that thread alone: core_share.py).

The exponential is numba_exp's (within 1e-8 before its rounding to float32, where numpy calls
libm), so a row's log-sum-exp can differ from encode_np's in its last float32 bit, and its
codes then by one step; the base phase keeps encode_np, whose rows are llama-perplexity's to
the byte.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from numba import njit, prange

from kldtool.codec.rows import HEADER_SLOTS, _window, row_width
from kldtool.compiled.numba_exp import exp_f64
from kldtool.compiled.core_share import one_core, spread


@njit(cache=True, fastmath={"reassoc"}, error_model="numpy")
def _exp_sum(x, mx):
    s = 0.0
    for j in range(len(x)):
        s += np.float64(exp_f64(x[j] - mx))
    return s


@njit(cache=True, inline="always")
def _row_stat(r, logits, mx, lowest, sums):
    x = logits[r]
    hi, lo = x[0], x[0]
    for j in range(1, len(x)):
        hi = max(hi, x[j])
        lo = min(lo, x[j])
    mx[r], lowest[r] = hi, lo
    sums[r] = _exp_sum(x, hi)


@njit(cache=True, inline="always")
def _row_codes(r, logits, mn, inv, rows, first):
    """Codes into ``rows`` from column ``first`` on (whole rows passed, so one compiled
    signature serves every block: a one-row slice would be typed contiguous)."""
    x, o, row_min, k = logits[r], rows[r], mn[r], inv[r]
    for j in range(len(x)):
        q = np.rint(k * (x[j] - row_min))
        o[first + j] = np.uint16(0.0 if x[j] <= row_min else q)


@njit(cache=True, inline="always")
def _row(r, logits, mx, lowest, sums, mn, inv, rows, first, codes):
    """Row ``r``'s part of the first pass (its statistics) or, with ``codes``, of the second."""
    if codes:
        _row_codes(r, logits, mn, inv, rows, first)
    else:
        _row_stat(r, logits, mx, lowest, sums)


@njit(parallel=True, cache=True, nogil=True)
def _rows(logits, mx, lowest, sums, mn, inv, rows, first, codes):
    for r in prange(logits.shape[0]):
        _row(r, logits, mx, lowest, sums, mn, inv, rows, first, codes)


@njit(cache=True, nogil=True)
def _rows_one_core(logits, mx, lowest, sums, mn, inv, rows, first, codes):
    for r in range(logits.shape[0]):
        _row(r, logits, mx, lowest, sums, mn, inv, rows, first, codes)


def encode_compiled(logits: np.ndarray, codec: str, clamp: float) -> tuple[np.ndarray, np.ndarray]:
    """encode_np(logits, codec, clamp): uint16 rows and M = max + lse per row."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n_rows, n_vocab = logits.shape
    loop = _rows if spread() else _rows_one_core
    mx, lowest = np.empty(n_rows, np.float32), np.empty(n_rows, np.float32)
    sums = np.empty(n_rows, np.float64)
    rows = np.zeros((n_rows, row_width(n_vocab)), dtype=np.uint16)
    loop(logits, mx, lowest, sums, mx, mx, rows, HEADER_SLOTS, False)
    lse = np.log(sums).astype(np.float32)
    mn, scale = _window(np, lowest, mx, lse, codec, clamp)
    rows[:, :HEADER_SLOTS] = np.stack([scale, (mn - mx) - lse], axis=1).astype(np.float32).view(np.uint16)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    loop(logits, mx, lowest, sums, mn.astype(np.float32), inv, rows, HEADER_SLOTS, True)
    return rows, mx + lse


def warm(all_cores: bool = True) -> None:
    """Compile, or load from numba's cache, the loop encode_compiled runs for its types: on
    every core, or (``all_cores`` False, a lane's) on the calling thread alone."""
    with nullcontext() if all_cores else one_core():
        encode_compiled(np.zeros((1, 8), np.float32), "grid", 16.0)
