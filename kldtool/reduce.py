"""The reducer: compared logits + base rows -> a handful of numbers per scored token.

Runs wherever the logits are (CPU or CUDA) with no Python loop over tokens or vocabulary;
only the per-token records leave the device. The arithmetic follows llama-perplexity's
``log_softmax`` (FORMAT.md §5): float32 terms, float64 sums, KLD over the base entries whose
decoded log-prob exceeds -16 (minus the file's clamp window, when kldtool's container stores
a wider one), base probabilities not renormalized, first-index argmax.

Beyond llama.cpp's five records, the same pass yields (conventions in ``docs/metrics.md``):
reverse KLD KL(q‖base), Jensen–Shannon divergence, the overlap of the two models' top-5 and
top-10 sets, and the base's top-1 probability.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from kldtool.codec import decode_torch, normalizer_torch

KLD_FLOOR = -16.0  # llama.cpp's; a base file's own is header.kld_floor
# Rows reduced at once: bounds the (block, V) float32 temporaries (~8 of them).
ROW_BLOCK = 32
TOP_K = (5, 10)  # top-1 agreement is same_top: both break ties by the lowest token id

FIELDS = {"nll": np.float32, "nll_base": np.float32, "kld": np.float64, "dp": np.float32, "same_top": np.bool_,
          "rkld": np.float64, "jsd": np.float64, "top5": np.uint8, "top10": np.uint8, "ptop_base": np.float32,
          "kld_tail": np.float64}


@dataclass
class TokenRecords:
    """Per scored token, host numpy arrays of equal length (dtypes in ``FIELDS``)."""

    nll: np.ndarray  # compared model
    nll_base: np.ndarray  # decoded from the base row
    kld: np.ndarray  # KL(base‖q); llama.cpp keeps the double for its sums, float for percentiles
    dp: np.ndarray  # p_q(target) - p_base(target)
    same_top: np.ndarray  # argmax agreement
    rkld: np.ndarray  # KL(q‖base)
    jsd: np.ndarray  # Jensen–Shannon divergence (nats)
    top5: np.ndarray  # |top5(q) ∩ top5(base)|
    top10: np.ndarray  # |top10(q) ∩ top10(base)|
    ptop_base: np.ndarray  # the base's largest probability
    kld_tail: np.ndarray  # top-K base rows: estimate of the KLD the unstored tail hides (else 0)

    def __len__(self) -> int:
        return len(self.nll)

    @classmethod
    def empty(cls, n: int) -> "TokenRecords":
        return cls(*(np.zeros(n, dt) for dt in FIELDS.values()))

    @classmethod
    def from_columns(cls, cols) -> "TokenRecords":
        return cls(*(np.asarray(cols[f], dt) for f, dt in FIELDS.items()))

    @classmethod
    def concat(cls, parts: list["TokenRecords"]) -> "TokenRecords":
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))


def reduce_base(logits, base_rows, targets, header) -> TokenRecords:
    """Reduce against a base file's rows as its header (``keep``, ``kld_floor``) describes them:
    full rows, or top-K records (reduce_topk.py)."""
    if header.keep:
        from kldtool.reduce_topk import reduce_topk_rows

        return reduce_topk_rows(logits, base_rows, targets, header.keep, header.kld_floor)
    return reduce_rows(logits, base_rows, targets, header.kld_floor)


def reduce_rows(logits, base_rows, targets, floor: float = KLD_FLOOR) -> TokenRecords:
    """Reduce compared logits (R, V) against int16 base rows (R, NV) for target ids (R,); base
    entries at or below ``floor`` (the file's -clamp, -16 in llama.cpp's layout) count as clamped."""
    import torch

    kind = reducer_for(logits.device)
    if kind == "numba":
        from kldtool.reduce_cpu import reduce_rows_cpu

        return _records(reduce_rows_cpu(logits.to("cpu", torch.float32).numpy(), base_rows.cpu().numpy(),
                                        np.asarray(targets, np.int64), floor))
    base_rows = base_rows.to(logits.device)
    n_vocab = logits.shape[1]
    targets = torch.as_tensor(targets, dtype=torch.int64, device=logits.device)
    blocks = [(logits[a:a + ROW_BLOCK], base_rows[a:a + ROW_BLOCK], targets[a:a + ROW_BLOCK])
              for a in range(0, logits.shape[0], ROW_BLOCK)]
    if kind == "triton":
        from kldtool.reduce_triton import reduce_rows_triton

        core = reduce_rows_triton(logits, base_rows, targets, floor).cpu().numpy()
        extra = [_extras_only(lg, rows, n_vocab, floor) for lg, rows, _ in blocks]
        return _records(list(core) + [torch.cat([e[k] for e in extra]).cpu().numpy() for k in range(5)])
    out = [_reduce_block(lg, rows, t, n_vocab, floor) for lg, rows, t in blocks]
    return _records([torch.cat([o[k] for o in out]).cpu().numpy() for k in range(10)])


def _records(cols: list) -> TokenRecords:
    """Records from the reducer's columns in ``FIELDS`` order; a missing ``kld_tail`` is 0."""
    if len(cols) < len(FIELDS):
        cols = cols + [np.zeros(len(cols[0]))]
    return TokenRecords(*(np.asarray(a, dt) for a, dt in zip(cols, FIELDS.values())))


def reducer_for(device) -> str:
    """Which reducer runs on ``device``: the one-pass Triton kernel on CUDA when Triton is
    installed, the compiled numba loop (reduce_cpu.py) on the CPU, else the torch ops here.
    ``KLDTOOL_REDUCER=torch|numba|triton`` forces one (triton on the CPU needs
    ``TRITON_INTERPRET=1``: tests only)."""
    choice = os.environ.get("KLDTOOL_REDUCER", "auto")
    if choice in ("torch", "numba", "triton"):
        return choice
    if getattr(device, "type", "cpu") == "cuda":
        return "triton" if _installed("triton") else "torch"
    return "numba" if _installed("numba") else "torch"


@functools.cache
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _prepare(logits, rows, n_vocab):
    """float32 logits, their log-normalizer M = max + lse and first argmax, decoded base row."""
    import torch

    logits = logits.to(torch.float32)
    mx, imax, lse = normalizer_torch(logits)
    return logits, mx + lse, imax, decode_torch(rows, n_vocab)


def _reduce_block(logits, rows, targets, n_vocab, floor):
    import torch

    logits, big_m, imax, b = _prepare(logits, rows, n_vocab)
    tcol = targets[:, None]
    nll = big_m - logits.gather(1, tcol)[:, 0]
    nll_base = -b.gather(1, tcol)[:, 0]
    imax_base = b.argmax(dim=1)
    terms = torch.exp(b) * ((b - logits) + big_m[:, None])
    kld = torch.where(b > floor, terms, torch.zeros_like(terms)).sum(dim=1, dtype=torch.float64)
    dp = torch.exp(-nll) - torch.exp(-nll_base)
    return (nll, nll_base, kld, dp, imax == imax_base, *_extras_block(logits, big_m, b, floor))


def _extras_only(logits, rows, n_vocab, floor):
    logits, big_m, _, b = _prepare(logits, rows, n_vocab)
    return _extras_block(logits, big_m, b, floor)


def _extras_block(logits, big_m, b, floor):
    """(reverse KLD, JSD, top-5 overlap, top-10 overlap, base top-1 probability) per row.

    Reverse KLD sums over every entry, a clamped base entry counting at the floor value its code
    decodes to (above its true log-prob, so the term is a lower bound of the true one). JSD
    takes the base's probabilities as the forward KLD does: clamped entries are 0.

    Both are written in d = log q - log p, whose float32 rounding error scales with d: terms
    like q (log q - log p) would carry an error of eps * |log p| each, ~1e-6 nats a row, as
    large as the divergence of a model against itself.
    """
    import torch

    logq = logits - big_m[:, None]
    d = logq - b
    em = torch.expm1(d)
    p = torch.exp(b)
    # Σ q d = Σ p (e^d (d - 1) + 1) - (Σ p - 1): each term second order in d, and the
    # rounding of the normalizer M cancels between the two sums.
    rkld = (p * (em * (d - 1) + d)).sum(dim=1, dtype=torch.float64) - (p.sum(dim=1, dtype=torch.float64) - 1)
    jsd = jsd_terms(b, logq, floor, d, em).sum(dim=1, dtype=torch.float64)
    top_b = order_keys(b).topk(max(TOP_K), dim=1).indices
    return (rkld, jsd, *top_overlaps(logits, top_b), torch.exp(b.max(dim=1).values))


def top_overlaps(logits, top_b) -> list:
    """|top-k(q) ∩ top-k(base)| per row for each k of ``TOP_K``, from the base's top ids (most
    probable first, at least max(TOP_K) of them)."""
    top_q = order_keys(logits).topk(max(TOP_K), dim=1).indices
    return [(top_q[:, :n, None] == top_b[:, None, :n]).sum(dim=(1, 2)) for n in TOP_K]


def jsd_terms(b, logq, floor, d=None, em=None):
    """Per entry, its share of the Jensen–Shannon divergence: p g(d) for a kept base entry,
    with d = log q - log p and g(d) = (e^d d - (1 + e^d) s) / 2, s = log((1 + e^d) / 2), whose
    rounding error scales with d (the textbook form's with |log p|); q ln 2 / 2 for a clamped
    one (p = 0)."""
    import torch

    if d is None:
        d = logq - b
        em = torch.expm1(d)
    s = torch.log1p(em / 2)
    g = ((1 + em) * d - (2 + em) * s) / 2
    return torch.where(b > floor, torch.exp(b) * g, torch.exp(logq) * float(np.log(2.0) / 2))


def order_keys(x):
    """int64 keys ordered as the values (float32 or integer), ties broken towards the lower
    index: top-k sets that do not depend on how topk treats equal values (bf16 logits and
    uint16 codes tie often)."""
    import torch

    if x.is_floating_point():
        bits = (x.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 -> +0.0
        ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    else:
        ordered = x.to(torch.int64)
    width = x.shape[1]
    return ordered * (1 << 32) + (width - 1 - torch.arange(width, device=x.device))
