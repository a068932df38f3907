"""Row math the torch-based backends share (full rows, the Triton path's extras, top-K rows):
blocks of rows, the normalizer, and the extra records' formulas (``docs/metrics.md``)."""

from __future__ import annotations

import numpy as np

from kldtool.codec.keys import order_keys
from kldtool.codec.rows import decode_torch, normalizer_torch

CLAMPED_AT = -16.0  # llama.cpp's; a base file's own is header.clamped_at
# Rows reduced at once: bounds the (block, V) float32 temporaries (~8 of them).
ROW_BLOCK = 32
TOP_K = (5, 10)  # top-1 agreement is same_top: both break ties by the lowest token id


def row_blocks(logits, base_rows, targets):
    """(logits, base rows, targets) of each block of ROW_BLOCK rows, on the logits' device."""
    import torch

    base_rows = base_rows.to(logits.device)
    targets = torch.as_tensor(targets, dtype=torch.int64, device=logits.device)
    return [
        (logits[a : a + ROW_BLOCK], base_rows[a : a + ROW_BLOCK], targets[a : a + ROW_BLOCK])
        for a in range(0, logits.shape[0], ROW_BLOCK)
    ]


def prepare(logits, rows, n_vocab):
    """float32 logits, their log-normalizer M = max + lse and first argmax, decoded base row.
    float64 logits (a reference run's) stay float64, and so does everything computed from them:
    the decoded rows are exact in float64, so the reduction is then the float64 one."""
    import torch

    if logits.dtype == torch.float64:
        mx, imax = logits.max(dim=1)
        lse = torch.log(torch.exp(logits - mx[:, None]).sum(dim=1))
        return logits, mx + lse, imax, decode_torch(rows, n_vocab).to(torch.float64)
    logits = logits.to(torch.float32)
    mx, imax, lse = normalizer_torch(logits)
    return logits, mx + lse, imax, decode_torch(rows, n_vocab)


def extras_block(logits, big_m, b, clamped_at):
    """Per row, by record name: reverse KLD, JSD, total variation, Σ p·q, top-5 and top-10
    overlaps, both models' top-1 probabilities and top-1 ids.

    Reverse KLD sums over every entry, a clamped base entry counting at the value its code
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
    jsd = jsd_terms(b, logq, clamped_at, d, em).sum(dim=1, dtype=torch.float64)
    top_b = top_ids(b, max(TOP_K))
    top_q = top_ids(logits, max(TOP_K))
    top5, top10 = top_overlaps(top_q, top_b)
    p_kept, q = torch.where(b > clamped_at, p, 0.0), torch.exp(logq)  # a clamped base entry counts as 0
    return {
        "rkld": rkld,
        "jsd": jsd,
        "tv": (p_kept - q).abs().sum(dim=1, dtype=torch.float64) / 2,
        "same_sample": (p_kept * q).sum(dim=1, dtype=torch.float64),
        "top5": top5,
        "top10": top10,
        "ptop_base": torch.exp(b.max(dim=1).values),
        "ptop_q": torch.exp(logq.max(dim=1).values),
        "top1_q": top_q[:, 0],
        "top1_base": top_b[:, 0],
    }


def top_overlaps(top_q, top_b) -> list:
    """|top-k(q) ∩ top-k(base)| per row for each k of ``TOP_K``, from both models' top ids
    (most probable first, at least max(TOP_K) of them)."""
    return [(top_q[:, :n, None] == top_b[:, None, :n]).sum(dim=(1, 2)) for n in TOP_K]


# Candidates topk keeps beyond k: a tie at the k-th value that runs past them sends the row to
# the exact (slower) path.
SPARE = 6


def top_ids(x, k: int):
    """Per row of ``x`` (floats, or integers such as codes), the ids of its k largest entries,
    largest first, equal values lowest id first (order_keys' rule). topk on the values picks
    k + SPARE candidates, which are put in that order; only rows where the k-th value's ties may
    run past the candidates pay for exact keys over the whole row."""
    import torch

    width = x.shape[1]
    c = min(k + SPARE, width)
    vals, idx = x.topk(c, dim=1)
    keys = order_keys(vals) if x.is_floating_point() else vals.to(torch.int64) * (1 << 32)
    keys = (keys - keys.remainder(1 << 32)) + (width - 1 - idx)  # the column position becomes the id
    ids = idx.gather(1, keys.argsort(dim=1, descending=True))[:, :k]
    unsure = (vals[:, c - 1] == vals[:, k - 1]) if c < width else torch.zeros_like(vals[:, 0], dtype=torch.bool)
    if bool(unsure.any()):
        rows = unsure.nonzero()[:, 0]
        ids[rows] = order_keys(x[rows]).topk(k, dim=1).indices
    return ids


def jsd_terms(b, logq, clamped_at, d=None, em=None):
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
    return torch.where(b > clamped_at, torch.exp(b) * g, torch.exp(logq) * float(np.log(2.0) / 2))
