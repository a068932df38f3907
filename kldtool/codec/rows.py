"""Log-probability rows <-> uint16 codes, bit for bit as llama-perplexity writes them.

A row of ``row_width(V)`` uint16 holds two float32 (scale, min_log_prob) in its first four
slots, then one code per vocabulary entry (and one zero pad slot when V is odd).
Decoding is ``log p[i] = scale * q[i] + min_log_prob``; entries at or below the clamp
(``max_logit - clamp``) are stored as 0.

Two encoders write that same layout (every reader, llama.cpp's included, decodes both):

- ``llamacpp``: llama-perplexity's own rule, step ``(max - min) / 65535`` over a 16-nat window.
  Every operation is spelled out in float32 with llama.cpp's association, so the codes are
  byte-identical to llama.cpp's when the logits are. The only deviation is ``expf``: we use
  float64 ``exp`` rounded to float32 (the correctly rounded value), which can move
  ``min_log_prob`` by one ulp on another libm but never changes a code.
- ``grid``: a power-of-two step, 2^-12 nats, over a 65535-step window (15.99976 nats). Logits
  of bf16/fp16 models sit on a binary grid; 16/65535 is not a power of two, so llama.cpp's
  rule rounds them with a systematic bias (every entry within 8 nats of the top decodes
  low): about -2e-5 nats of mean KLD for a bf16 model against itself. On the 2^-12 grid
  such logits are represented exactly, and fp32 logits are no worse off. kldtool's own
  container uses it by default.

The clamp window is 16 nats in llama.cpp's layout. kldtool's container may store a wider one
(``base --clamp C``, C in 16..64, recorded in its metadata) for models whose tails matter below
-16; the grid step then doubles per doubling of the window (2^-11 up to 32 nats), so 65535
codes still span it, and readers count entries above -C in the KLD.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

DEFAULT_CLAMP = 16.0
MAX_CLAMP = 64.0
CODE_MAX = 65535
GRID_STEP = 2.0**-12
# llama.cpp's own rounding (byte-identical raw files) and kldtool's power-of-two grid, by --codec's names.
LLAMA_ROUNDING, GRID = "llamacpp", "grid"
CODECS = (LLAMA_ROUNDING, GRID)
HEADER_SLOTS = 4
# Rows handled at once: bounds the float64 temporaries to ~ block * V * 8 bytes.
ROW_BLOCK = 64


@dataclass(frozen=True)
class Coding:
    """How base rows are made: the rounding rule (one of ``CODECS``), the clamp window in nats
    below each row's top, and for compact files the entries kept per row (None: full rows)."""

    codec: str = "grid"
    clamp: float = DEFAULT_CLAMP
    keep: int | None = None


def check_clamp(clamp: float) -> float:
    """The clamp window, refused outside DEFAULT_CLAMP..MAX_CLAMP (ValueError with the reason)."""
    if not DEFAULT_CLAMP <= clamp <= MAX_CLAMP:
        raise ValueError(f"clamp window of {clamp:g} nats outside {DEFAULT_CLAMP:g}..{MAX_CLAMP:g}")
    return float(clamp)


def grid_step(clamp: float) -> float:
    """The grid codec's power-of-two step for a clamp window: 2^-12 for 16 nats, doubled per
    doubling of the window, so 65535 steps always reach (nearly) across it."""
    return GRID_STEP * 2.0 ** math.ceil(math.log2(clamp / DEFAULT_CLAMP))


def row_width(n_vocab: int) -> int:
    """uint16 slots per row: 2*ceil(V/2) + 4 (the odd-V pad keeps rows 4-byte aligned)."""
    return 2 * ((n_vocab + 1) // 2) + HEADER_SLOTS


def _window(xp, lowest, mx, lse, codec: str, clamp: float = DEFAULT_CLAMP):
    """Per row (its lowest code's log-prob mn, step scale), in float32, for numpy or torch (``xp``).

    llama.cpp: mn = max(lowest, mx - C), scale = (mx - mn) / 65535, C the clamp window (16 in
    llama.cpp). grid: step g = grid_step(C), mn = max(lowest, mx - min(C, 65535 g)), scale = g -
    except in rows where that would let the clamped tail (code 0, decoded as mn - mx - lse)
    rise above -C, the absolute clamp above which readers (llama-perplexity too) count an
    entry in the KLD: that happens when the top token holds all but ~g of the mass, and such
    rows keep llama.cpp's rule.
    """
    # Python scalars do not widen float32 arrays (NumPy >= 2 and torch alike).
    mn = xp.maximum(lowest, mx - clamp)
    scale = (mx - mn) / CODE_MAX
    if codec != "grid":
        return mn, scale
    step = grid_step(clamp)
    g_mn = xp.maximum(lowest, mx - min(clamp, step * CODE_MAX))
    tail_visible = (lowest < g_mn) & (((g_mn - mx) - lse) > -clamp)
    return xp.where(tail_visible, mn, g_mn), xp.where(tail_visible, scale, xp.full_like(scale, step))


# ---------------------------------------------------------------- numpy


def normalizer_np(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max, log-sum-exp) per row in float32, as llama.cpp's log_softmax computes them."""
    mx = logits.max(axis=1)
    e = np.exp((logits - mx[:, None]).astype(np.float64)).astype(np.float32)
    lse = np.log(e.sum(axis=1, dtype=np.float64)).astype(np.float32)
    return mx, lse


def encode_np(
    logits: np.ndarray, codec: str = LLAMA_ROUNDING, clamp: float = DEFAULT_CLAMP
) -> tuple[np.ndarray, np.ndarray]:
    """Encode float32 logits (R, V) into uint16 rows (R, row_width(V)) with ``codec`` over a
    ``clamp``-nat window.

    Returns the rows and ``M = max + lse`` per row (float32), so the caller gets the
    target NLL as ``M - logits[r, t]`` without a second pass.
    """
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    n_rows, n_vocab = logits.shape
    rows = np.zeros((n_rows, row_width(n_vocab)), dtype=np.uint16)
    norm = np.empty(n_rows, dtype=np.float32)
    for a in range(0, n_rows, ROW_BLOCK):
        b = min(a + ROW_BLOCK, n_rows)
        rows[a:b], norm[a:b] = _encode_block_np(logits[a:b], codec, clamp, n_vocab)
    return rows, norm


def _encode_block_np(l: np.ndarray, codec: str, clamp: float, n_vocab: int):
    mx, lse = normalizer_np(l)
    mn, scale = _window(np, l.min(axis=1), mx, lse, codec, clamp)
    min_log_prob = (mn - mx) - lse
    out = np.zeros((l.shape[0], row_width(n_vocab)), dtype=np.uint16)
    out[:, :HEADER_SLOTS] = np.stack([scale, min_log_prob], axis=1).astype(np.float32).view(np.uint16)
    live = scale != 0
    if live.any():
        ll = l[live]
        inv = np.float32(1) / scale[live]
        diff = ll - mn[live][:, None]
        q = np.rint(inv[:, None] * diff)
        q[ll <= mn[live][:, None]] = 0
        out[np.nonzero(live)[0][:, None], np.arange(HEADER_SLOTS, HEADER_SLOTS + n_vocab)] = q.astype(np.uint16)
    return out, mx + lse


def row_params_np(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, min_log_prob) float32 arrays of uint16 rows."""
    head = np.ascontiguousarray(rows[:, :HEADER_SLOTS]).view(np.float32)
    return head[:, 0], head[:, 1]


def decode_np(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Decode uint16 rows to float32 log-probs (R, V): float multiply, then float add."""
    scale, min_log_prob = row_params_np(rows)
    q = rows[:, HEADER_SLOTS : HEADER_SLOTS + n_vocab].astype(np.float32)
    return q * scale[:, None] + min_log_prob[:, None]


# ---------------------------------------------------------------- torch
# Rows travel as int16 tensors (torch's uint16 lacks most ops); the bits are the same.


def normalizer_torch(logits, exact: bool = False):
    """(max, first argmax, log-sum-exp) per row, float32; the exp sum accumulates in float64.

    ``exact`` evaluates exp in float64 and rounds to float32 (what the writer needs to match
    llama.cpp's min_log_prob to the ulp); otherwise float32 exp, which is cheaper on a GPU.
    """
    import torch

    mx, imax = logits.max(dim=1)
    shifted = logits - mx[:, None]
    e = torch.exp(shifted.to(torch.float64)).to(torch.float32) if exact else torch.exp(shifted)
    lse = torch.log(e.sum(dim=1, dtype=torch.float64)).to(torch.float32)
    return mx, imax, lse


def window_torch(lowest, mx, lse, codec: str, clamp: float):
    """Per row, from its min, max and log-sum-exp: the lowest code's log-prob mn, 1 / scale (0 where the scale
    is 0) and the row's header slots (scale, min_log_prob) as int16, on their device."""
    import torch

    mn, scale = _window(torch, lowest, mx, lse, codec, clamp)
    inv = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    head = torch.stack([scale, (mn - mx) - lse], dim=1).contiguous().view(torch.int16)
    return mn, inv, head


def encode_torch(logits, codec: str = LLAMA_ROUNDING, clamp: float = DEFAULT_CLAMP):
    """Torch twin of :func:`encode_np`; returns (int16 rows on the logits' device, M)."""
    import torch

    logits = logits.to(torch.float32)
    n_rows, n_vocab = logits.shape
    mx, _, lse = normalizer_torch(logits, exact=True)
    mn, inv, head = window_torch(logits.min(dim=1).values, mx, lse, codec, clamp)
    q = torch.round(inv[:, None] * (logits - mn[:, None]))
    q = torch.where(logits <= mn[:, None], torch.zeros_like(q), q).to(torch.int32)
    q = torch.where(q > 32767, q - 65536, q).to(torch.int16)
    pad = torch.zeros((n_rows, row_width(n_vocab) - HEADER_SLOTS - n_vocab), dtype=torch.int16, device=logits.device)
    return torch.cat([head, q, pad], dim=1), mx + lse


def decode_torch(rows, n_vocab: int):
    """Decode int16 (or uint16-bit) rows on any device to float32 log-probs."""
    import torch

    head = rows[:, :HEADER_SLOTS].contiguous().view(torch.float32)
    q = rows[:, HEADER_SLOTS : HEADER_SLOTS + n_vocab].to(torch.int32) & 0xFFFF
    return q.to(torch.float32) * head[:, 0:1] + head[:, 1:2]


def rows_to_torch(rows: np.ndarray, device=None):
    """uint16 numpy rows -> int16 tensor (same bits) on ``device``."""
    import torch

    with warnings.catch_warnings():
        # A read-only array (rows straight from a file's bytes) is shared, not copied: the
        # reducers only read base rows.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(np.ascontiguousarray(rows).view(np.int16))
    return t.to(device, non_blocking=True) if device is not None else t


def rows_to_numpy(rows) -> np.ndarray:
    """int16 tensor rows -> uint16 numpy array on the host."""
    return rows.detach().cpu().numpy().view(np.uint16)
