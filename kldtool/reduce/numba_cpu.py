"""The reducer as compiled loops over each row, for logits on the CPU (numba).

A row is read three times while it sits in cache: a scan for both top-10 lists (which also
gives both argmaxes and the max), skipping the blocks whose maximum cannot enter them; the
exp-sum; then every record at once. The last two are branch-free loops with no libm calls,
which LLVM turns into SIMD code (8 float32 or 4 float64 lanes); rows run in parallel on
numba's threads. Scalar libm calls, as an earlier version made, cost several times these loops
(a row needs three per entry; docs/benchmarks.md has the measurements).

Our own exponentials therefore: the normalizer's and the base probabilities' (whose sums are
PPL and llama.cpp's KLD) in float64 arithmetic rounded to float32 (``numba_exp.exp_f64``, < 1e-8 before
rounding, like libm's expf to within its rounding); those of reverse KLD and JSD in float32
(``_exp``, < 3e-7), e^d - 1 near 0 from its series, log((1 + e^d) / 2) from one atanh series
on either side of d = ln 3. Terms are float32 and sums float64, as in the torch reducer
(torch_ops.py, rowmath.py), so both meet the same float64 references; first-index argmax and
top-k ties broken towards the lower id. Sums may be reassociated (float64 rounding, 1e-16
relative); no multiply-add is fused, so base codes decode as llama.cpp decodes them.
Compiled on first use and cached on disk (numba's ``cache=True``).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

# numba checks every array argument against np.ma.MaskedArray, and numpy imports np.ma on first
# use: two reducer threads doing that at once (llama.cpp's lanes) recursed until RecursionError
# (a CI run of test_vocabularies). Imported here, it is whole before any thread can reduce.
import numpy.ma  # noqa: F401
from numba import njit, prange

from kldtool.codec.rows import HEADER_SLOTS
from kldtool.compiled.numba_exp import exp_f64 as _exp_f64
from kldtool.compiled.core_share import one_core, spread
from kldtool.reduce.records import WHOLE_ROW

TOP_N = 10  # rowmath.TOP_K is (5, TOP_N): _reduce's overlaps
# The loop's three output tables, by dtype, column by column: _reduce_row writes them in this
# order. Declared here rather than derived from records.FIELDS, because numba's cache sees the
# constants of this file alone; the check below holds them to the schema.
OUT64 = ("kld", "rkld", "jsd", "tv", "same_sample")
OUT32 = ("nll", "nll_base", "dp", "ptop_base", "ptop_q")
OUTI = ("same_top", "top5", "top10", "top1_q", "top1_base")
if sorted(OUT64 + OUT32 + OUTI) != sorted(WHOLE_ROW):
    raise TypeError(f"the numba reducer's columns are not records.WHOLE_ROW: {sorted(OUT64 + OUT32 + OUTI)}")
SPAN = 64  # entries per block of the top-list scan
_FM = {"reassoc"}  # float64 sums may be vectorized; nothing else is relaxed
_F = np.float32
_ZERO, _ONE, _TWO, _FOUR = _F(0.0), _F(1.0), _F(2.0), _F(4.0)
_LN2 = _F(np.log(2.0))
_HALF_LN2 = _F(np.log(2.0) / 2)
_CUT = _F(0.5)  # |d| below which e^d - 1 comes from its own series
_LOG2E = _F(1.4426950408889634)
_LN2_HI, _LN2_LO = _F(0.693145751953125), _F(1.428606765330187e-06)  # ln 2 in two parts: exact k ln2_hi
_X_MIN, _X_MAX = _F(-87.0), _F(88.0)  # exp's range here: below, 1.6e-38 stands for 0 (never a NaN)


@njit(cache=True, inline="always")
def _exp(x):
    """e^x in float32 arithmetic, < 3e-7 relative: a degree-7 polynomial on |r| <= ln2 / 2
    times 2^k made from its bits."""
    x = min(max(x, _X_MIN), _X_MAX)
    k = np.rint(x * _LOG2E)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = _ONE + r * (
        _ONE
        + r
        * (_F(1 / 2) + r * (_F(1 / 6) + r * (_F(1 / 24) + r * (_F(1 / 120) + r * (_F(1 / 720) + r * _F(1 / 5040))))))
    )
    return poly * np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)


@njit(cache=True, inline="always")
def _expm1_series(d):
    return d * (
        _ONE
        + d
        * (_F(1 / 2) + d * (_F(1 / 6) + d * (_F(1 / 24) + d * (_F(1 / 120) + d * (_F(1 / 720) + d * _F(1 / 5040))))))
    )


@njit(cache=True, inline="always")
def _atanh2_series(z):
    """2 atanh(z) = log((1 + z) / (1 - z)) for |z| <= 1/3, series to z^15."""
    z2 = z * z
    return (
        _TWO
        * z
        * (
            _ONE
            + z2
            * (
                _F(1 / 3)
                + z2
                * (
                    _F(1 / 5)
                    + z2 * (_F(1 / 7) + z2 * (_F(1 / 9) + z2 * (_F(1 / 11) + z2 * (_F(1 / 13) + z2 * _F(1 / 15)))))
                )
            )
        )
    )


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


@njit(cache=True, inline="always")
def _order_key(v):
    """An int32 ordered as the float32 v (-0.0 just below +0.0)."""
    bits = np.float32(v).view(np.int32)
    return bits ^ ((bits >> np.int32(31)) & np.int32(0x7FFFFFFF))


@njit(cache=True, error_model="numpy")
def _top_lists(x, c, scale, lowest, qv, qi, bv, bi):
    """The TOP_N largest logits and base entries, ties to the lower id (their first entries
    are the argmaxes). A block of ``SPAN`` entries is scanned only when its maximum (integer
    max of order keys and codes: SIMD) beats the list's last entry, which after the first
    blocks it rarely does."""
    nq = 0
    nb = 0
    for a in range(0, len(x), SPAN):
        xa, ca = x[a : a + SPAN], c[a : a + SPAN]
        kmax = _order_key(xa[0])
        cmax = ca[0]
        for j in range(len(xa)):
            kmax = max(kmax, _order_key(xa[j]))
            cmax = max(cmax, ca[j])
        if nq < TOP_N or kmax > _order_key(qv[TOP_N - 1]):
            for j in range(len(xa)):
                nq = _push(qv, qi, nq, xa[j], a + j)
        if nb < TOP_N or _F(cmax) * scale + lowest > bv[TOP_N - 1]:
            for j in range(len(xa)):
                nb = _push(bv, bi, nb, _F(ca[j]) * scale + lowest, a + j)


@njit(cache=True, fastmath=_FM, error_model="numpy")
def _exp_sum(x, mx, e):
    """e = exp(x - mx) over the row, returned with its float64 sum."""
    s = 0.0
    for j in range(len(x)):
        v = _exp_f64(x[j] - mx)
        e[j] = v
        s += np.float64(v)
    return s


@njit(cache=True, fastmath=_FM, error_model="numpy")
def _records(x, c, e, big_m, inv_s, scale, lowest, clamped_at):
    """(KL(base‖q), Σ p (e^d (d - 1) + 1), Σ p, JSD, Σ |p - q|, Σ p q) of one row; branch-free (each
    "if" below is a select), so it runs as SIMD code."""
    kld = 0.0
    rk = 0.0
    p_sum = 0.0
    js = 0.0
    tv = 0.0
    same = 0.0
    for j in range(len(x)):
        b = _F(c[j]) * scale + lowest
        d = (x[j] - big_m) - b
        p = _exp_f64(b)
        ed = _exp(d)
        em = _expm1_series(d) if abs(d) < _CUT else ed - _ONE
        kept = b > clamped_at
        rk += np.float64(p * (em * (d - _ONE) + d))
        p_sum += np.float64(p)
        kld += np.float64(p * ((b - x[j]) + big_m) if kept else _ZERO)
        # s = log((1 + e^d) / 2) = log1p(em / 2), or d - ln 2 + log1p(e^-d) once em / 2 > 1;
        # log1p(v) = 2 atanh(v / (2 + v)), whose argument is em / (4 + em) or 1 / (2 e^d + 1):
        # one division either way
        near = em <= _TWO
        z = (em if near else _ONE) / ((_FOUR + em) if near else (_TWO * ed + _ONE))
        s = _atanh2_series(z) + (_ZERO if near else d - _LN2)
        g = ((_ONE + em) * d - (_TWO + em) * s) / _TWO
        js += np.float64(p * g if kept else e[j] * inv_s * _HALF_LN2)
        q = e[j] * inv_s
        tv += np.float64(abs((p if kept else _ZERO) - q))
        same += np.float64((p if kept else _ZERO) * q)
    return kld, rk, p_sum, js, tv, same


@njit(cache=True, inline="always")
def _reduce_row(r, logits, rows, heads, targets, clamped_at, out64, out32, outi):
    n_vocab = logits.shape[1]
    x = logits[r]
    c = rows[r, HEADER_SLOTS : HEADER_SLOTS + n_vocab]  # a row of a C-contiguous array: unit stride, SIMD loads
    scale, lowest = heads[r, 0], heads[r, 1]
    qv = np.empty(TOP_N, np.float32)
    qi = np.empty(TOP_N, np.int64)
    bv = np.empty(TOP_N, np.float32)
    bi = np.empty(TOP_N, np.int64)
    _top_lists(x, c, scale, lowest, qv, qi, bv, bi)
    mx = qv[0]
    e = np.empty(n_vocab, np.float32)  # exp(x - max), kept: q below costs no second exp
    s = _exp_sum(x, mx, e)
    big_m = mx + np.float32(np.log(s))
    inv_s = np.float32(1.0 / s)
    kld, rk, p_sum, js, tv, same = _records(x, c, e, big_m, inv_s, scale, lowest, clamped_at)
    t = targets[r]
    nll = big_m - x[t]
    nll_base = -(np.float32(c[t]) * scale + lowest)
    out64[r, 0] = kld
    out64[r, 1] = rk - (p_sum - 1.0)
    out64[r, 2] = js
    out64[r, 3] = tv / 2.0
    out64[r, 4] = same
    out32[r, 0] = nll
    out32[r, 1] = nll_base
    out32[r, 2] = np.exp(-nll) - np.exp(-nll_base)
    out32[r, 3] = np.exp(bv[0])
    out32[r, 4] = inv_s  # exp(mx - big_m): the compared model's largest probability
    outi[r, 0] = qi[0] == bi[0]
    outi[r, 1] = _overlap(qi, bi, 5)
    outi[r, 2] = _overlap(qi, bi, TOP_N)
    outi[r, 3] = qi[0]
    outi[r, 4] = bi[0]


@njit(parallel=True, cache=True, nogil=True)
def _reduce(logits, rows, heads, targets, clamped_at, out64, out32, outi):
    for r in prange(logits.shape[0]):
        _reduce_row(r, logits, rows, heads, targets, clamped_at, out64, out32, outi)


@njit(cache=True, nogil=True)
def _reduce_one_core(logits, rows, heads, targets, clamped_at, out64, out32, outi):
    for r in range(logits.shape[0]):
        _reduce_row(r, logits, rows, heads, targets, clamped_at, out64, out32, outi)


def reduce_rows_cpu(
    logits: np.ndarray, rows: np.ndarray, targets: np.ndarray, clamped_at: float
) -> dict[str, np.ndarray]:
    """float32 logits (R, V), int16 or uint16 base rows (R, NV), int64 targets (R,) -> the
    reducer's columns by ``reduce.FIELDS`` name (those of whole rows)."""
    n_rows, n_vocab = logits.shape
    rows = np.ascontiguousarray(rows).view(np.uint16)
    heads = np.ascontiguousarray(rows[:, :HEADER_SLOTS]).view(np.float32)
    out64 = np.empty((n_rows, len(OUT64)), np.float64)
    out32 = np.empty((n_rows, len(OUT32)), np.float32)
    outi = np.empty((n_rows, len(OUTI)), np.int64)
    loop = _reduce if spread() else _reduce_one_core
    loop(
        np.ascontiguousarray(logits, np.float32),
        rows,
        heads,
        np.ascontiguousarray(targets, np.int64),
        np.float32(clamped_at),
        out64,
        out32,
        outi,
    )
    return {**dict(zip(OUT64, out64.T)), **dict(zip(OUT32, out32.T)), **dict(zip(OUTI, outi.T))}


def warm(on_one_core: bool = False, on_all_cores: bool = True) -> None:
    """Compile, or load from numba's cache, the loops a run uses for the argument types
    reduce_rows_cpu passes: on one core (calls side by side on threads of their own), on all
    cores (numba's parallel loop also starts its thread pool, which a run that never calls it
    should not pay for). Each load is CPU time beside the engine's first batch."""
    rows = np.zeros((1, HEADER_SLOTS + 8), np.uint16)
    modes = ([one_core] if on_one_core else []) + ([nullcontext] if on_all_cores else [])
    for mode in modes:
        with mode():
            reduce_rows_cpu(np.zeros((1, 8), np.float32), rows, np.zeros(1, np.int64), -16.0)
