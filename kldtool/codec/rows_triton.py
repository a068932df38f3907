"""The row encoder (rows.encode_torch) as two Triton kernels, for CUDA devices: the same codes,
with no (rows, vocab) temporaries.

encode_torch makes a dozen passes over float32 copies of the logits (the float64 exponentials
alone are twice their size); on a GPU that traffic, not arithmetic, is its cost, and it is most of
a hidden-state base's replay. Here one program owns a row: the first kernel reads it twice (max
and min, then the exponential sum, each exp evaluated in float64 and rounded to float32 as
encode_torch does), torch computes each row's window from those three numbers with the very
code encode_torch uses (rows.window_torch), and the second kernel reads the row once more and writes
its codes. Rounding is half to even, spelled out with floor; the codes kernel is compiled
without fused multiply-adds, which would take the fraction from the unrounded product.

Tested on CPU under ``TRITON_INTERPRET=1`` against encode_torch, code for code.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kldtool.codec.rows import HEADER_SLOTS, row_width, window_torch

TILE = 1024
NUM_WARPS = 4


@triton.jit
def _stats_kernel(logits_ptr, stride, out_ptr, n_rows, n_vocab, TILE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    row = logits_ptr + r * stride
    lanes = tl.arange(0, TILE)
    hi = tl.full((TILE,), float("-inf"), tl.float32)
    lo = tl.full((TILE,), float("inf"), tl.float32)
    for start in range(0, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(row + offs, mask=valid, other=0.0).to(tl.float32)
        hi = tl.maximum(hi, tl.where(valid, x, float("-inf")))
        lo = tl.minimum(lo, tl.where(valid, x, float("inf")))
    mx = tl.max(hi, 0)
    total = tl.zeros((TILE,), tl.float64)
    for start in range(0, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(row + offs, mask=valid, other=0.0).to(tl.float32)
        e = tl.exp((x - mx).to(tl.float64)).to(tl.float32)
        total += tl.where(valid, e, 0.0).to(tl.float64)
    tl.store(out_ptr + r, mx)
    tl.store(out_ptr + n_rows + r, tl.min(lo, 0))
    tl.store(out_ptr + 2 * n_rows + r, tl.log(tl.sum(total, 0)).to(tl.float32))


@triton.jit
def _codes_kernel(logits_ptr, stride, window_ptr, rows_ptr, row_stride, n_rows, n_vocab, TILE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    row = logits_ptr + r * stride
    out = rows_ptr + r * row_stride
    mn = tl.load(window_ptr + r)
    inv = tl.load(window_ptr + n_rows + r)
    lanes = tl.arange(0, TILE)
    for start in range(0, n_vocab, TILE):
        offs = start + lanes
        valid = offs < n_vocab
        x = tl.load(row + offs, mask=valid, other=0.0).to(tl.float32)
        y = inv * (x - mn)
        fl = tl.floor(y)
        frac = y - fl  # exact below 2^23
        odd = (fl - 2.0 * tl.floor(fl * 0.5)) == 1.0
        q = fl + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)
        q = tl.where(x <= mn, 0.0, q)
        tl.store(out + offs, q.to(tl.int32).to(tl.uint16), mask=valid)


def encode_triton(logits, codec: str = "grid", clamp: float = 16.0):
    """encode_torch's contract on a CUDA tensor: (int16 rows on the logits' device, M = max + lse)."""
    import torch

    n_rows, n_vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    tile = min(TILE, triton.next_power_of_2(n_vocab))
    stats = torch.empty((3, n_rows), dtype=torch.float32, device=logits.device)
    rows = torch.zeros((n_rows, row_width(n_vocab)), dtype=torch.int16, device=logits.device)
    if not n_rows:
        return rows, stats[0]
    _stats_kernel[(n_rows,)](logits, logits.stride(0), stats, n_rows, n_vocab, TILE=tile, num_warps=NUM_WARPS)
    mx, lowest, lse = stats
    mn, inv, head = window_torch(lowest, mx, lse, codec, clamp)
    window = torch.stack([mn, inv]).contiguous()
    codes = rows.view(torch.uint16)[:, HEADER_SLOTS:]
    _codes_kernel[(n_rows,)](
        logits,
        logits.stride(0),
        window,
        codes,
        codes.stride(0),
        n_rows,
        n_vocab,
        TILE=tile,
        num_warps=NUM_WARPS,
        enable_fp_fusion=False,  # y - floor(y) must see the rounded product, never a fused one
    )
    rows[:, :HEADER_SLOTS] = head
    return rows, mx + lse
