"""The reducer as one Triton kernel, for CUDA devices.

The torch reducer (``torch_ops.py``) launches a dozen elementwise kernels per block of rows, each
reading and writing a (rows, vocab) float32 temporary: on an H100 that is memory traffic many
times the size of the inputs. Here each program owns one row and streams it once: compared
logits and base codes are each read a single time, in tiles, and everything else stays in
registers.

One pass needs the log-sum-exp before it is known. With ``m`` the running max of the logits
and ``x' = x - m``, llama.cpp's term ``p_b (b - x + M)`` with ``M = m + lse'`` splits into
``p_b (b - x')`` (summed as ``s1``, small terms like llama.cpp's, no cancellation) plus
``lse' * Σ p_b``; when ``m`` grows by ``Δ`` the terms already in ``s1`` grow by ``Δ p_b``, so
``s1 += Δ Σ p_b``. Sums are float64 like llama.cpp's; terms float32.

A second pass over the row, once ``M`` is known, sums the reverse KLD and the JSD in the
torch reducer's forms (rowmath.extras_block: terms in ``d = log q - log p``, second order in
``d``), with ``expm1`` and ``log1p`` written out (a Taylor polynomial near 0, where the
difference ``exp(d) - 1`` would lose the digits; Triton's libdevice versions do not run under
its CPU interpreter). The first pass's argmaxes give both top-1 ids and the base's top-1
probability. For the top-5/10 sets the second pass also keeps each lane's three largest
logits and base codes: the top ten of a row are among those candidates unless a lane holds
more than three of them. After the pass the program takes the ten largest off the lanes' heads
one at a time (the largest head, the lowest id among equal ones), counts the two sets' overlaps,
and flags the row when some lane's third candidate reaches the tenth value: such rows, rare, go
through topk over the whole row. Nothing vocabulary-sized or lane-sized leaves the kernel.

Tested on CPU under ``TRITON_INTERPRET=1`` against float64 numpy references; the GPU
benchmark (``benchmarks/gpu_reducer.py``) measures it against the torch reducer.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from kldtool.codec.rows import HEADER_SLOTS
from kldtool.reduce.records import WHOLE_ROW
from kldtool.reduce.rowmath import TOP_K

# The fastest launch found for one window's 1,023 bf16 rows of 128,256 on an H100, or within
# 0.1 ms of it (benchmarks/gpu_reducer.py --sweep; the figures are in docs/benchmarks.md).
TILE = 1024
NUM_WARPS = 4
STAGES = 1
SLOTS = 16  # a row's top-10 ids in a Triton vector, whose length must be a power of two
# The record table's rows, in the order the kernel stores them (by position: a module global
# of Triton's constexpr type would be read by vLLM's scan of every loaded module, which breaks
# on it). The check below holds them to the schema.
COLUMNS = (
    "nll",
    "nll_base",
    "kld",
    "dp",
    "same_top",
    "rkld",
    "jsd",
    "ptop_base",
    "top1_q",
    "top1_base",
    "top5",
    "top10",
    "tv",
    "ptop_q",
    "same_sample",
    "unsure",
)
if sorted(COLUMNS[:-1]) != sorted(WHOLE_ROW):
    raise TypeError(f"the Triton reducer's columns are not records.WHOLE_ROW: {sorted(COLUMNS[:-1])}")


@triton.jit
def _step(x, b, offs, clamped_at, m, i_max, b_max, i_bmax, s, s1, p_sum):
    """Fold one tile into every lane's running values."""
    grew = x > m  # strict: within a lane the first maximum wins
    i_max = tl.where(grew, offs, i_max)
    m_new = tl.maximum(m, x)
    s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
    s1 += (m_new - m) * p_sum
    keep = b > clamped_at
    p = tl.where(keep, tl.exp(b), 0.0)
    # selected, not multiplied: p = 0 times an -inf logit would be NaN
    s1 += tl.where(keep, p * (b - x + m_new), 0.0)
    p_sum += p
    b_grew = b > b_max
    i_bmax = tl.where(b_grew, offs, i_bmax)
    b_max = tl.maximum(b_max, b)
    return m_new, i_max, b_max, i_bmax, s, s1, p_sum


@triton.jit
def _expm1(d):
    # |d| < 1/8: the series to d^7 (relative error < 4e-10); beyond, exp(d) - 1 loses < 1e-6.
    t = d * (1.0 + d * (0.5 + d * (1.0 / 6 + d * (1.0 / 24 + d * (1.0 / 120 + d * (1.0 / 720 + d / 5040))))))
    return tl.where(tl.abs(d) < 0.125, t, tl.exp(d) - 1.0)


@triton.jit
def _log1p(y):
    # |y| < 1/16: the series to y^7 (relative error < 4e-10); beyond, log(1 + y) loses < 1e-6.
    t = y * (1.0 - y * (0.5 - y * (1.0 / 3 - y * (0.25 - y * (0.2 - y * (1.0 / 6 - y / 7))))))
    return tl.where(tl.abs(y) < 0.0625, t, tl.log(1.0 + y))


@triton.jit
def _extras(x, b, valid, big_m, row_m, inv_s, clamped_at, rk, p_all, js, tv, same):
    """Fold one tile into the reverse KLD's, the JSD's, the total variation's and Σ p q's lane
    sums (rowmath.extras_block)."""
    logq = x - big_m
    d = logq - b
    em = _expm1(d)
    p = tl.exp(b)
    rk += tl.where(valid, p * (em * (d - 1.0) + d), 0.0).to(tl.float64)
    p_all += tl.where(valid, p, 0.0).to(tl.float64)
    s = _log1p(em * 0.5)
    g = ((1.0 + em) * d - (2.0 + em) * s) * 0.5
    js += tl.where(valid, tl.where(b > clamped_at, p * g, tl.exp(logq) * 0.34657359027997264), 0.0).to(tl.float64)
    # q as exp(x - max) / Σ: exp(log q) would carry log q's rounding, eps |log q| relative
    p_kept = tl.where(b > clamped_at, p, 0.0)
    q = tl.exp(x - row_m) * inv_s
    tv += tl.where(valid, tl.abs(p_kept - q), 0.0).to(tl.float64)
    same += tl.where(valid, p_kept * q, 0.0).to(tl.float64)
    return rk, p_all, js, tv, same


@triton.jit
def _top3(v, i, v1, i1, v2, i2, v3, i3):
    """Insert each lane's new entry (value ``v``, id ``i``) into the lane's three largest,
    largest first; strict comparisons: the lane sees ids in increasing order, so among equal
    values the lower id stays ahead (order_keys' rule)."""
    gt1 = v > v1
    gt2 = v > v2
    gt3 = v > v3
    v3 = tl.where(gt2, v2, tl.where(gt3, v, v3))
    i3 = tl.where(gt2, i2, tl.where(gt3, i, i3))
    v2 = tl.where(gt1, v1, tl.where(gt2, v, v2))
    i2 = tl.where(gt1, i1, tl.where(gt2, i, i2))
    v1 = tl.where(gt1, v, v1)
    i1 = tl.where(gt1, i, i1)
    return v1, i1, v2, i2, v3, i3


@triton.jit
def _top_ids(v1, i1, v2, i2, v3, i3, none_id, K: tl.constexpr, SLOTS: tl.constexpr):
    """(the row's K largest ids in slots 0..K-1, largest first and equal values lowest id
    first; whether they may be wrong): the lanes' heads hold each lane's largest remaining
    candidate, so the largest head is the row's next entry, unless a lane had more than three
    of the K (its third candidate reaches the K-th value)."""
    tl.static_assert(K <= SLOTS)
    third = tl.max(v3, 0)
    slots = tl.arange(0, SLOTS)
    ids = tl.full((SLOTS,), -1, tl.int32)
    kth = third
    for j in tl.static_range(K):
        best = tl.max(v1, 0)
        pick = tl.min(tl.where(v1 == best, i1, none_id), 0)
        ids = tl.where(slots == j, pick, ids)
        hit = (v1 == best) & (i1 == pick)
        v1, i1 = tl.where(hit, v2, v1), tl.where(hit, i2, i1)
        v2, i2 = tl.where(hit, v3, v2), tl.where(hit, i3, i2)
        v3, i3 = tl.where(hit, float("-inf"), v3), tl.where(hit, none_id, i3)
        kth = best
    return ids, third >= kth


@triton.jit
def _overlap(a, b, n: tl.constexpr, SLOTS: tl.constexpr):
    """|first n of a ∩ first n of b| (ids)."""
    slots = tl.arange(0, SLOTS)
    both = (a[:, None] == b[None, :]) & (slots[:, None] < n) & (slots[None, :] < n)
    return tl.sum(tl.sum(both.to(tl.int32), 1), 0)


@triton.jit
def _reduce_kernel(
    logits_ptr,
    logits_stride,
    codes_ptr,
    codes_stride,
    head_ptr,
    targets_ptr,
    out_ptr,
    n_rows,
    n_vocab,
    clamped_at,
    TILE: tl.constexpr,
    STAGES: tl.constexpr,
    TOP_A: tl.constexpr,
    TOP_B: tl.constexpr,
    SLOTS: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    lrow = logits_ptr + r * logits_stride
    crow = codes_ptr + r * codes_stride  # uint16 codes
    scale = tl.load(head_ptr + 2 * r)
    lowest = tl.load(head_ptr + 2 * r + 1)

    # Every lane keeps its own running values over the entries it sees (one per tile); the
    # lanes are combined once, after the loop: cross-lane reductions inside the loop cost
    # more than the memory traffic.
    lanes = tl.arange(0, TILE)
    # A finite start for the max keeps every difference below finite (no -inf - -inf).
    m = tl.full((TILE,), -3.0e38, tl.float32)  # max of x
    i_max = tl.zeros((TILE,), tl.int32)
    b_max = tl.full((TILE,), float("-inf"), tl.float32)
    i_bmax = tl.zeros((TILE,), tl.int32)
    s = tl.zeros((TILE,), tl.float32)  # Σ exp(x - m)
    s1 = tl.zeros((TILE,), tl.float32)  # Σ p_b (b - (x - m)) over kept entries
    p_sum = tl.zeros((TILE,), tl.float32)  # Σ p_b over kept entries
    # Whole tiles without masks (the kernel is bound by arithmetic, not memory), then the tail.
    n_full = (n_vocab // TILE) * TILE
    for start in tl.range(0, n_full, TILE, num_stages=STAGES):
        offs = start + lanes
        x = tl.load(lrow + offs).to(tl.float32)
        b = tl.load(crow + offs).to(tl.float32) * scale + lowest
        m, i_max, b_max, i_bmax, s, s1, p_sum = _step(x, b, offs, clamped_at, m, i_max, b_max, i_bmax, s, s1, p_sum)
    for start in range(n_full, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(lrow + offs, mask=valid, other=float("-inf")).to(tl.float32)
        b = tl.where(valid, tl.load(crow + offs, mask=valid, other=0).to(tl.float32) * scale + lowest, float("-inf"))
        m, i_max, b_max, i_bmax, s, s1, p_sum = _step(x, b, offs, clamped_at, m, i_max, b_max, i_bmax, s, s1, p_sum)

    # Combine lanes: the first index among the lanes holding the row's maximum, and the sums
    # moved from each lane's max to the row's.
    row_m = tl.max(m, 0)
    first = tl.min(tl.where(m == row_m, i_max, n_vocab), 0)
    first_b = tl.min(tl.where(b_max == tl.max(b_max, 0), i_bmax, n_vocab), 0)
    shift = (row_m - m).to(tl.float64)
    total = tl.sum(s.to(tl.float64) * tl.exp(-shift), 0)
    kept = p_sum.to(tl.float64)
    s1_row = tl.sum(s1.to(tl.float64) + shift * kept, 0)
    p_row = tl.sum(kept, 0)

    lse = tl.log(total).to(tl.float32)
    big_m = row_m + lse
    inv_s = (1.0 / total).to(tl.float32)
    t = tl.load(targets_ptr + r)
    nll = big_m - tl.load(lrow + t).to(tl.float32)
    qt = tl.load(crow + t)
    nll_base = -(qt.to(tl.float32) * scale + lowest)
    # The second pass, M known: reverse KLD (over every entry, a clamped one at the value its
    # code decodes to) and JSD.
    rk = tl.zeros((TILE,), tl.float64)
    p_all = tl.zeros((TILE,), tl.float64)
    js = tl.zeros((TILE,), tl.float64)
    tv = tl.zeros((TILE,), tl.float64)
    same = tl.zeros((TILE,), tl.float64)
    # The same pass keeps each lane's three largest logits and base codes (the top-k
    # candidates). Codes rank as the values they decode to unless the scale is 0.
    live = (scale > 0).to(tl.float32)
    none = tl.full((TILE,), float("-inf"), tl.float32)
    no_id = tl.full((TILE,), n_vocab, tl.int32)
    x1, xi1, x2, xi2, x3, xi3 = none, no_id, none, no_id, none, no_id
    c1, ci1, c2, ci2, c3, ci3 = none, no_id, none, no_id, none, no_id
    for start in tl.range(0, n_full, TILE, num_stages=STAGES):
        offs = start + lanes
        x = tl.load(lrow + offs).to(tl.float32)
        c = tl.load(crow + offs).to(tl.float32)
        b = c * scale + lowest
        rk, p_all, js, tv, same = _extras(
            x, b, offs < n_vocab, big_m, row_m, inv_s, clamped_at, rk, p_all, js, tv, same
        )
        x1, xi1, x2, xi2, x3, xi3 = _top3(x, offs, x1, xi1, x2, xi2, x3, xi3)
        c1, ci1, c2, ci2, c3, ci3 = _top3(c * live, offs, c1, ci1, c2, ci2, c3, ci3)
    for start in range(n_full, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(lrow + offs, mask=valid, other=0.0).to(tl.float32)
        c = tl.load(crow + offs, mask=valid, other=0).to(tl.float32)
        b = c * scale + lowest
        rk, p_all, js, tv, same = _extras(x, b, valid, big_m, row_m, inv_s, clamped_at, rk, p_all, js, tv, same)
        x1, xi1, x2, xi2, x3, xi3 = _top3(tl.where(valid, x, none), offs, x1, xi1, x2, xi2, x3, xi3)
        c1, ci1, c2, ci2, c3, ci3 = _top3(tl.where(valid, c * live, none), offs, c1, ci1, c2, ci2, c3, ci3)
    top_q, unsure_q = _top_ids(x1, xi1, x2, xi2, x3, xi3, n_vocab, TOP_B, SLOTS)
    top_b, unsure_b = _top_ids(c1, ci1, c2, ci2, c3, ci3, n_vocab, TOP_B, SLOTS)

    # One float64 record table (float32 values and ids are exact in it): one copy to the host.
    tl.store(out_ptr + r, nll.to(tl.float64))
    tl.store(out_ptr + n_rows + r, nll_base.to(tl.float64))
    tl.store(out_ptr + 2 * n_rows + r, s1_row + lse.to(tl.float64) * p_row)
    tl.store(out_ptr + 3 * n_rows + r, (tl.exp(-nll) - tl.exp(-nll_base)).to(tl.float64))
    tl.store(out_ptr + 4 * n_rows + r, (first == first_b).to(tl.float64))
    tl.store(out_ptr + 5 * n_rows + r, tl.sum(rk, 0) - (tl.sum(p_all, 0) - 1.0))
    tl.store(out_ptr + 6 * n_rows + r, tl.sum(js, 0))
    tl.store(out_ptr + 7 * n_rows + r, tl.exp(tl.max(b_max, 0)).to(tl.float64))
    tl.store(out_ptr + 8 * n_rows + r, first.to(tl.float64))
    tl.store(out_ptr + 9 * n_rows + r, first_b.to(tl.float64))
    tl.store(out_ptr + 10 * n_rows + r, _overlap(top_q, top_b, TOP_A, SLOTS).to(tl.float64))
    tl.store(out_ptr + 11 * n_rows + r, _overlap(top_q, top_b, TOP_B, SLOTS).to(tl.float64))
    tl.store(out_ptr + 12 * n_rows + r, tl.sum(tv, 0) * 0.5)
    tl.store(out_ptr + 13 * n_rows + r, inv_s.to(tl.float64))  # exp(row max - M)
    tl.store(out_ptr + 14 * n_rows + r, tl.sum(same, 0))
    tl.store(out_ptr + 15 * n_rows + r, (unsure_q.to(tl.int32) + 2 * unsure_b.to(tl.int32)).to(tl.float64))


def reduce_rows_triton(
    logits, base_rows, targets, clamped_at: float, tile: int = TILE, num_warps: int = NUM_WARPS, stages: int = STAGES
):
    """The kernel alone, the contract of ``reduce.reduce_rows`` for int16 ``base_rows`` on the logits' device;
    returns, on it, the (len(COLUMNS), rows) float64 record table, a row per ``COLUMNS`` name
    (the schema's whole-row columns, then ``unsure``). ``unsure`` is 1
    where the compared top-10 may miss an entry, 2 where the base's may, 3 where both may."""
    import torch

    n_rows, n_vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    head = base_rows[:, :HEADER_SLOTS].contiguous().view(torch.float32)
    codes = base_rows[:, HEADER_SLOTS:].view(torch.uint16)  # same bits; loads convert directly
    targets = _on_device(targets, logits.device)
    out = torch.empty((len(COLUMNS), n_rows), dtype=torch.float64, device=logits.device)
    tile = min(tile, triton.next_power_of_2(n_vocab))
    if n_rows:
        _reduce_kernel[(n_rows,)](
            logits,
            logits.stride(0),
            codes,
            codes.stride(0),
            head,
            targets,
            out,
            n_rows,
            n_vocab,
            clamped_at,
            TILE=tile,
            STAGES=stages,
            TOP_A=TOP_K[0],
            TOP_B=TOP_K[1],
            SLOTS=SLOTS,
            num_warps=num_warps,
        )
    return out


def _on_device(targets, device):
    """Target ids on ``device`` without waiting for it: a copy from pageable host memory would
    first wait for every kernel queued before it (the forward), so they go through pinned memory."""
    import torch

    if isinstance(targets, torch.Tensor) and targets.device == device:
        return targets.to(torch.int64)
    host = torch.as_tensor(np.asarray(targets, np.int64))
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
