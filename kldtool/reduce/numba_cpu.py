"""The reducer as one compiled loop per row, for logits on the CPU (numba).

The torch reducer makes some thirty passes over (rows, vocab) float32 temporaries per block of
rows; on 2 cores that cost 0.5 to 1.7 s per 255-row chunk of real SmolLM2 rows (49,152
vocabulary). Here a row is streamed three times while it sits in cache (max, exp-sum, then
every record at once) and rows run in parallel on numba's threads: 0.23 s.

The torch reducer's formulas (torch_ops.py, rowmath.py), so both meet the same float64 references: float32
terms, float64 sums, first-index argmax, top-k ties broken towards the lower id.
Compiled on first use and cached on disk (numba's ``cache=True``): the first run on a machine
pays a few seconds once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from kldtool.codec.rows import HEADER_SLOTS

TOP_N = 10  # rowmath.TOP_K is (5, TOP_N): _reduce's overlaps
_ONE, _TWO = np.float32(1.0), np.float32(2.0)
_HALF_LN2 = np.float32(np.log(2.0) / 2)
_CUT = 0.5  # |d| below which e^d - 1 comes from its own series
# libm's exp, expm1 and log1p cost 5-11 ns each here (scalar calls, float64 inside) and a row
# needs three per entry: these inline float64 series give float32 accuracy for a third.
_LOG2E, _LN2 = 1.4426950408889634, 0.6931471805599453
_POW2 = np.array([2.0 ** k for k in range(-200, 201)])


@njit(cache=True, inline="always")
def _exp(x):
    """e^x, relative error < 1e-8 (float64 arithmetic; x below -138 gives 0)."""
    if x < -138.0:
        return 0.0
    k = np.floor(x * _LOG2E + 0.5)
    r = x - k * _LN2  # |r| <= ln2 / 2: the Taylor series to r^7 leaves < 5e-9
    p = 1.0 + r * (1.0 + r * (0.5 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (1 / 720 + r / 5040))))))
    return p * _POW2[int(k) + 200]


@njit(cache=True, inline="always")
def _expm1(x):
    """e^x - 1 without the cancellation near 0 (series to x^9 below _CUT, < 3e-10 relative)."""
    if -_CUT < x < _CUT:
        return x * (1.0 + x * (0.5 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120 + x * (1 / 720 + x * (
            1 / 5040 + x * (1 / 40320 + x / 362880))))))))
    return _exp(x) - 1.0


@njit(cache=True, inline="always")
def _log1p(u):
    """log(1 + u) for u > -1: 2 atanh(u / (2 + u)), whose series to z^15 is < 1e-8 relative
    while u <= 1; libm's log beyond."""
    if u > 1.0:
        return np.log(1.0 + u)
    z = u / (2.0 + u)
    z2 = z * z
    return 2.0 * z * (1.0 + z2 * (1 / 3 + z2 * (1 / 5 + z2 * (1 / 7 + z2 * (1 / 9 + z2 * (1 / 11 + z2 * (
        1 / 13 + z2 / 15)))))))


@njit(cache=True, inline="always")
def _push(vals, ids, n, v, i):
    """Insert (v, i) into the descending top list of ``n`` entries (capacity len(vals)); ids
    arrive in increasing order, so an equal value already there stays ahead. Returns the new n."""
    cap = len(vals)
    if n == cap and not v > vals[cap - 1]:
        return n
    j = n if n < cap else cap - 1
    while j > 0 and v > vals[j - 1]:
        if j < cap:
            vals[j] = vals[j - 1]
            ids[j] = ids[j - 1]
        j -= 1
    vals[j] = v
    ids[j] = i
    return n + 1 if n < cap else n


@njit(cache=True, inline="always")
def _overlap(a, b, k):
    n = 0
    for i in range(k):
        for j in range(k):
            if a[i] == b[j]:
                n += 1
    return n


@njit(parallel=True, cache=True, nogil=True)
def _reduce(logits, codes, heads, targets, floor, out64, out32, outi):
    n_rows, n_vocab = logits.shape
    for r in prange(n_rows):
        x = logits[r]
        mx = x[0]
        imax = 0
        for i in range(1, n_vocab):
            if x[i] > mx:
                mx = x[i]
                imax = i
        e = np.empty(n_vocab, np.float32)  # exp(x - max), kept: q below costs no second exp
        s = 0.0
        for i in range(n_vocab):
            e[i] = np.float32(_exp(x[i] - mx))
            s += e[i]
        big_m = mx + np.float32(np.log(s))
        inv_s = np.float32(1.0 / s)
        scale, lowest = heads[r, 0], heads[r, 1]
        p_lowest = np.float32(_exp(lowest))  # code 0, most of a row: its probability once
        kld = 0.0
        rk = 0.0
        p_sum = 0.0
        js = 0.0
        b_max = lowest
        ib_max = 0
        qv = np.empty(TOP_N, np.float32)
        qi = np.empty(TOP_N, np.int64)
        bv = np.empty(TOP_N, np.float32)
        bi = np.empty(TOP_N, np.int64)
        nq = 0
        nb = 0
        for i in range(n_vocab):
            c = codes[r, i]
            b = np.float32(c) * scale + lowest
            xi = x[i]
            logq = xi - big_m
            d = logq - b
            q = e[i] * inv_s
            p = p_lowest if c == 0 else np.float32(_exp(b))
            em = np.float32(_expm1(d))
            rk += p * (em * (d - _ONE) + d)
            p_sum += p
            if b > floor:
                kld += p * ((b - xi) + big_m)
                sl = np.float32(_log1p(em / _TWO))
                js += p * (((_ONE + em) * d - (_TWO + em) * sl) / _TWO)
            else:
                js += q * _HALF_LN2
            if b > b_max or i == 0:
                b_max = b
                ib_max = i
            nq = _push(qv, qi, nq, xi, i)
            nb = _push(bv, bi, nb, b, i)
        t = targets[r]
        nll = big_m - x[t]
        nll_base = -(np.float32(codes[r, t]) * scale + lowest)
        out64[r, 0] = kld
        out64[r, 1] = rk - (p_sum - 1.0)
        out64[r, 2] = js
        out32[r, 0] = nll
        out32[r, 1] = nll_base
        out32[r, 2] = np.exp(-nll) - np.exp(-nll_base)
        out32[r, 3] = np.exp(b_max)
        outi[r, 0] = imax == ib_max
        outi[r, 1] = _overlap(qi, bi, 5)
        outi[r, 2] = _overlap(qi, bi, TOP_N)


def reduce_rows_cpu(logits: np.ndarray, rows: np.ndarray, targets: np.ndarray, floor: float) -> list[np.ndarray]:
    """float32 logits (R, V), int16 or uint16 base rows (R, NV), int64 targets (R,) -> the
    reducer's columns in ``reduce.FIELDS`` order but ``kld_tail``."""
    n_rows, n_vocab = logits.shape
    rows = np.ascontiguousarray(rows).view(np.uint16)
    heads = np.ascontiguousarray(rows[:, :HEADER_SLOTS]).view(np.float32)
    codes = rows[:, HEADER_SLOTS:HEADER_SLOTS + n_vocab]
    out64 = np.empty((n_rows, 3), np.float64)
    out32 = np.empty((n_rows, 4), np.float32)
    outi = np.empty((n_rows, 3), np.int64)
    _reduce(np.ascontiguousarray(logits, np.float32), codes, heads, np.ascontiguousarray(targets, np.int64),
            np.float32(floor), out64, out32, outi)
    return [out32[:, 0], out32[:, 1], out64[:, 0], out32[:, 2], outi[:, 0].astype(bool),
            out64[:, 1], out64[:, 2], outi[:, 1], outi[:, 2], out32[:, 3]]
