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
more than three of them, which rowmath.candidate_top detects (such rows, rare, go through
topk over the whole row).

Tested on CPU under ``TRITON_INTERPRET=1`` against float64 numpy references; the GPU
benchmark (``benchmarks/gpu_reducer.py``) measures it against the torch reducer.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from kldtool.codec.rows import HEADER_SLOTS
from kldtool.reduce.records import PendingRecords, TokenRecords, to_records
from kldtool.reduce.rowmath import TOP_K, candidate_top, top_ids, top_overlaps

# H100, 2048 rows of 128,256 (bf16 / fp32 logits): 1024 lanes, 4 warps, no pipelining 2.70 / 2.61 ms;
# 512 lanes with 3 stages 3.14 / 3.31 ms (benchmarks/gpu_reducer.py --sweep).
TILE = 1024
NUM_WARPS = 4
STAGES = 1


@triton.jit
def _step(x, b, offs, floor, m, i_max, b_max, i_bmax, s, s1, p_sum):
    """Fold one tile into every lane's running values."""
    grew = x > m  # strict: within a lane the first maximum wins
    i_max = tl.where(grew, offs, i_max)
    m_new = tl.maximum(m, x)
    s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
    s1 += (m_new - m) * p_sum
    keep = b > floor
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
def _extras(x, b, valid, big_m, floor, rk, p_all, js):
    """Fold one tile into the reverse KLD's and the JSD's lane sums (rowmath.extras_block)."""
    logq = x - big_m
    d = logq - b
    em = _expm1(d)
    p = tl.exp(b)
    rk += tl.where(valid, p * (em * (d - 1.0) + d), 0.0).to(tl.float64)
    p_all += tl.where(valid, p, 0.0).to(tl.float64)
    s = _log1p(em * 0.5)
    g = ((1.0 + em) * d - (2.0 + em) * s) * 0.5
    js += tl.where(valid, tl.where(b > floor, p * g, tl.exp(logq) * 0.34657359027997264), 0.0).to(tl.float64)
    return rk, p_all, js


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
def _store_top3(vals, ids, lanes, TILE: tl.constexpr, v1, i1, v2, i2, v3, i3):
    """A row's candidates, each lane's first, second and third in turn."""
    tl.store(vals + lanes, v1)
    tl.store(vals + TILE + lanes, v2)
    tl.store(vals + 2 * TILE + lanes, v3)
    tl.store(ids + lanes, i1)
    tl.store(ids + TILE + lanes, i2)
    tl.store(ids + 2 * TILE + lanes, i3)


@triton.jit
def _reduce_kernel(
    logits_ptr,
    logits_stride,
    codes_ptr,
    codes_stride,
    head_ptr,
    targets_ptr,
    out_ptr,
    cand_ptr,
    cand_id_ptr,
    n_rows,
    n_vocab,
    floor,
    TILE: tl.constexpr,
    STAGES: tl.constexpr,
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
        m, i_max, b_max, i_bmax, s, s1, p_sum = _step(x, b, offs, floor, m, i_max, b_max, i_bmax, s, s1, p_sum)
    for start in range(n_full, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(lrow + offs, mask=valid, other=float("-inf")).to(tl.float32)
        b = tl.where(valid, tl.load(crow + offs, mask=valid, other=0).to(tl.float32) * scale + lowest, float("-inf"))
        m, i_max, b_max, i_bmax, s, s1, p_sum = _step(x, b, offs, floor, m, i_max, b_max, i_bmax, s, s1, p_sum)

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
    t = tl.load(targets_ptr + r)
    nll = big_m - tl.load(lrow + t).to(tl.float32)
    qt = tl.load(crow + t)
    nll_base = -(qt.to(tl.float32) * scale + lowest)
    # The second pass, M known: reverse KLD (over every entry, a clamped one at the value its
    # code decodes to) and JSD.
    rk = tl.zeros((TILE,), tl.float64)
    p_all = tl.zeros((TILE,), tl.float64)
    js = tl.zeros((TILE,), tl.float64)
    # The same pass keeps each lane's three largest logits and base codes (top-k candidates:
    # rowmath.candidate_top). Codes rank as the values they decode to unless the scale is 0.
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
        rk, p_all, js = _extras(x, b, offs < n_vocab, big_m, floor, rk, p_all, js)
        x1, xi1, x2, xi2, x3, xi3 = _top3(x, offs, x1, xi1, x2, xi2, x3, xi3)
        c1, ci1, c2, ci2, c3, ci3 = _top3(c * live, offs, c1, ci1, c2, ci2, c3, ci3)
    for start in range(n_full, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(lrow + offs, mask=valid, other=0.0).to(tl.float32)
        c = tl.load(crow + offs, mask=valid, other=0).to(tl.float32)
        b = c * scale + lowest
        rk, p_all, js = _extras(x, b, valid, big_m, floor, rk, p_all, js)
        x1, xi1, x2, xi2, x3, xi3 = _top3(tl.where(valid, x, none), offs, x1, xi1, x2, xi2, x3, xi3)
        c1, ci1, c2, ci2, c3, ci3 = _top3(tl.where(valid, c * live, none), offs, c1, ci1, c2, ci2, c3, ci3)
    vals, ids = cand_ptr + r * (6 * TILE), cand_id_ptr + r * (6 * TILE)
    _store_top3(vals, ids, lanes, TILE, x1, xi1, x2, xi2, x3, xi3)
    _store_top3(vals + 3 * TILE, ids + 3 * TILE, lanes, TILE, c1, ci1, c2, ci2, c3, ci3)

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


def reduce_rows_triton(
    logits, base_rows, targets, floor: float, tile: int = TILE, num_warps: int = NUM_WARPS, stages: int = STAGES
):
    """The kernel alone, the contract of ``reduce.reduce_rows`` for int16 ``base_rows`` on the logits' device;
    returns, on it, the (10, rows) float64 record table (nll, nll_base, kld, dp, same_top, rkld,
    jsd, ptop_base, top1_q, top1_base) and the top-k candidates: float32 values and int32 ids of
    shape (rows, 2, 3, lanes), each lane's three largest logits, then base codes."""
    import torch

    n_rows, n_vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    head = base_rows[:, :HEADER_SLOTS].contiguous().view(torch.float32)
    codes = base_rows[:, HEADER_SLOTS:].view(torch.uint16)  # same bits; loads convert directly
    targets = _on_device(targets, logits.device)
    out = torch.empty((len(COLUMNS), n_rows), dtype=torch.float64, device=logits.device)
    tile = min(tile, triton.next_power_of_2(n_vocab))
    cand = torch.empty((n_rows, 2, 3, tile), dtype=torch.float32, device=logits.device)
    cand_ids = torch.empty((n_rows, 2, 3, tile), dtype=torch.int32, device=logits.device)
    if n_rows:
        _reduce_kernel[(n_rows,)](
            logits,
            logits.stride(0),
            codes,
            codes.stride(0),
            head,
            targets,
            out,
            cand,
            cand_ids,
            n_rows,
            n_vocab,
            floor,
            TILE=tile,
            STAGES=stages,
            num_warps=num_warps,
        )
    return out, cand, cand_ids


def _on_device(targets, device):
    """Target ids on ``device`` without waiting for it: a copy from pageable host memory would
    first wait for every kernel queued before it (the forward), so they go through pinned memory."""
    import torch

    if isinstance(targets, torch.Tensor) and targets.device == device:
        return targets.to(torch.int64)
    host = torch.as_tensor(np.asarray(targets, np.int64))
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def triton_records(logits, base_rows, targets, floor: float, defer: bool = False):
    """The records: the kernel's, and the top-5/10 overlaps from its candidates (rows where
    they may miss an entry go through topk over the whole row), with one copy to the host;
    ``defer``: as PendingRecords, everything queued on the device and nothing waited for."""
    import torch

    base_rows = base_rows.to(logits.device)
    table, cand, cand_ids = reduce_rows_triton(logits, base_rows, targets, floor)
    k = max(TOP_K)
    top_q, unsure_q = candidate_top(cand[:, 0], cand_ids[:, 0], k)
    top_b, unsure_b = candidate_top(cand[:, 1], cand_ids[:, 1], k)
    overlaps = torch.stack(top_overlaps(top_q, top_b)).to(torch.float64)
    packed = torch.cat([table, overlaps, (unsure_q | unsure_b).to(torch.float64)[None]])
    finish = lambda: _on_host(packed, logits, base_rows)  # noqa: E731
    return PendingRecords(finish) if defer else finish()


def _on_host(packed, logits, base_rows) -> TokenRecords:
    import torch

    packed = packed.cpu().numpy()
    cols = dict(zip(COLUMNS, packed))
    top = packed[len(COLUMNS) : len(COLUMNS) + len(TOP_K)]
    unsure = np.nonzero(packed[-1])[0]
    for a in range(0, len(unsure), TOP_ROWS):
        idx = unsure[a : a + TOP_ROWS]
        rows = torch.as_tensor(idx, device=logits.device)
        top[:, idx] = torch.stack(_exact_overlaps(logits[rows], base_rows[rows])).cpu().numpy()
    return to_records([cols[f] for f in COLUMNS[:7]] + list(top) + [cols[f] for f in COLUMNS[7:]])


def _exact_overlaps(logits, rows) -> list:
    """The top-5/10 overlaps by topk over whole rows (rowmath.top_ids)."""
    import torch

    codes = rows[:, HEADER_SLOTS : HEADER_SLOTS + logits.shape[1]].to(torch.int32) & 0xFFFF
    # Codes rank as the values they decode to, unless the row's scale is 0 (all equal).
    codes *= rows[:, :HEADER_SLOTS].contiguous().view(torch.float32)[:, :1] > 0
    k = max(TOP_K)
    return top_overlaps(top_ids(logits, k), top_ids(codes, k))


COLUMNS = ("nll", "nll_base", "kld", "dp", "same_top", "rkld", "jsd", "ptop_base", "top1_q", "top1_base")
TOP_ROWS = 256  # rows whose int32 codes exist at once for topk
