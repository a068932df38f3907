"""The reducer for compact (top-K) base rows: the K stored entries exactly, the others as one
bucket on each side (base: the stored rest mass; compared model: the mass of its entries
outside the K ids, summed over its full row).

Merging entries into one bucket can only lower a KL divergence (log-sum inequality), so the
per-token KLD here is a lower bound of the full-row one. What the bucket hides is R_p times
the KLD between the two models' tails; the records estimate it from the stored ranks K/2..K
(``kld_tail``: R_p times the KLD of those ranks, each side normalised over them), the deepest
ranks whose log-probs are known. docs/metrics.md has the measured accuracy.
"""

from __future__ import annotations

from kldtool.codec.rows import normalizer_torch
from kldtool.codec.topk_records import split_records
from kldtool.reduce.records import TokenRecords, to_records
from kldtool.reduce.rowmath import TOP_K, jsd_terms, row_blocks, top_ids, top_overlaps


def reduce_topk_rows(logits, records, targets, k: int, clamped_at: float) -> TokenRecords:
    import torch

    out = [_block(lg, rec, t, k, clamped_at) for lg, rec, t in row_blocks(logits, records, targets)]
    if not out:
        return TokenRecords.empty(0)
    return to_records({f: torch.cat([o[f] for o in out]).cpu().numpy() for f in out[0]})


def _bucket(a, b):
    """a log(a / b) in float64, 0 where a is 0."""
    import torch

    return torch.where(a > 0, a * (torch.log(a) - torch.log(b)), torch.zeros_like(a))


def _block(logits, records, targets, k, clamped_at):
    import torch

    logits = logits.to(torch.float32)
    mx, imax, lse = normalizer_torch(logits)
    big_m = mx + lse
    scale, low, rest_p, tcode, ids, codes = split_records(records, k)
    b = codes.to(torch.float32) * scale[:, None] + low[:, None]
    logq = logits.gather(1, ids) - big_m[:, None]
    p, q = torch.exp(b), torch.exp(logq)
    # the compared model's mass outside the K ids, over its whole row (no 1 - Σ cancellation)
    rest_q = torch.exp(logits - big_m[:, None]).scatter(1, ids, 0.0).sum(dim=1, dtype=torch.float64)
    rest_p = rest_p.to(torch.float64)
    kept = b > clamped_at
    zero = torch.zeros_like(b)
    kld = torch.where(kept, p * (b - logq), zero).sum(dim=1, dtype=torch.float64) + _bucket(rest_p, rest_q)
    rkld = (q * (logq - b)).sum(dim=1, dtype=torch.float64) + _bucket(rest_q, rest_p)
    m = (rest_p + rest_q) / 2
    m = torch.where(m > 0, m, 1.0)
    jsd = jsd_terms(b, logq, clamped_at).sum(dim=1, dtype=torch.float64) + 0.5 * (
        _bucket(rest_p, m) + _bucket(rest_q, m)
    )
    nll = big_m - logits.gather(1, targets[:, None])[:, 0]
    nll_base = -(tcode.to(torch.float32) * scale + low)
    dp = torch.exp(-nll) - torch.exp(-nll_base)
    tail = rest_p * _band_kld(p[:, k // 2 :], q[:, k // 2 :], kept[:, k // 2 :])
    top_q = top_ids(logits, max(TOP_K))
    top5, top10 = top_overlaps(top_q, ids)
    # total variation: exact on the K ids; the tails' share lies between ½ |R_p - R_q| and ½ (R_p + R_q)
    p_kept = torch.where(kept, p, 0.0)
    tv_k = (p_kept - q).abs().sum(dim=1, dtype=torch.float64) / 2
    return {
        "nll": nll,
        "nll_base": nll_base,
        "kld": kld,
        "dp": dp,
        "same_top": imax == ids[:, 0],
        "rkld": rkld,
        "jsd": jsd,
        "top5": top5,
        "top10": top10,
        "ptop_base": p[:, 0],
        "ptop_q": torch.exp(mx - big_m),  # the compared rows are whole
        "kld_tail": tail,
        "top1_q": top_q[:, 0],
        "top1_base": ids[:, 0],
        "tv": tv_k + (rest_p - rest_q).abs() / 2,
        "tv_hi": tv_k + (rest_p + rest_q) / 2,
        "p_out": rest_p,
        "same_sample": (p_kept * q).sum(dim=1, dtype=torch.float64),  # the tails' products unknown: a lower bound
    }


def _band_kld(p, q, kept):
    """KLD between the two models' renormalised probabilities over the band's entries."""
    import torch

    p = torch.where(kept, p, torch.zeros_like(p)).to(torch.float64)
    q = q.to(torch.float64)
    ps, qs = p.sum(dim=1, keepdim=True), q.sum(dim=1, keepdim=True)
    ok = (ps > 0) & (qs > 0)
    pn, qn = p / torch.where(ok, ps, 1.0), q / torch.where(ok, qs, 1.0)
    return torch.where(ok[:, 0], _bucket(pn, torch.where(qn > 0, qn, 1e-300)).sum(dim=1), torch.zeros_like(ps[:, 0]))
