"""Per-token records where the compared model is known only by its top-K log-probs and the
log-prob of each target (what an OpenAI-compatible server returns), against full base rows.

Exact: the compared model's NLL, the base's, Δp, the same top (the compared model's top-1 is
in its top-K), the base's top-1 probability, and top-5/10 agreement where K reaches 5/10.
An interval: total variation, ½ Σ |p - q| (1 - TV is the rate at which speculative decoding
accepts the compared model's tokens as the base's): exact on S, and on the rest between
½ |P_out - R| and ½ (P_out + R), whatever the compared model does there.
Bounded: KLD, reverse KLD and JSD are each computed over S (the returned ids and the target)
plus one bucket for everything else, the base's mass outside S (P_out) against the compared
model's (R = 1 - its mass on S). Merging outcomes never raises an f-divergence, so each is a
lower bound of the full one (docs/endpoint.md). A clamped base entry counts as 0 for
KLD and JSD, as the full-row reducers count it, and at its decoded value for reverse KLD.
Estimated: what the bucket hides, P_out times the KLD between the two models' tails each
normalised, taken to be the KLD over the deepest returned ranks K/2..K each normalised
(``kld_tail``), the tail model the top-K base files use (reduce/topk_rows.py).
"""

from __future__ import annotations

import numpy as np

from kldtool.codec.rows import decode_np
from kldtool.reduce.records import TokenRecords, to_records
from kldtool.reduce.rowmath import TOP_K, top_ids

# The compared model's mass outside S, R = 1 - Σ_S q, is known to within this (float32
# log-probs from the server, summed): each bucket term takes the R in that interval that makes
# it least, so rounding can never lift a bound above the divergence.
REST_EPS = 1e-6


def _bucket(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a log(a / b), 0 where a is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, a * (np.log(np.maximum(a, 1e-300)) - np.log(b)), 0.0)


def reduce_quant_topk(
    rows: np.ndarray,
    n_vocab: int,
    clamped_at: float,
    ids: np.ndarray,
    logq: np.ndarray,
    target_logq: np.ndarray,
    targets,
) -> TokenRecords:
    """Records for uint16 base ``rows`` (R, W) and the compared model's top-K ``ids`` / ``logq``
    (R, K, best first; -1: an entry not known by id) and ``target_logq`` (R,) for ``targets``
    (R,): the bounds in ``kld``, ``rkld`` and ``jsd``, the total variation's interval in ``tv``
    .. ``tv_hi``, P_out in ``p_out`` and the tail's estimate in ``kld_tail``."""
    b = decode_np(rows, n_vocab).astype(np.float64)
    q = _Compared(ids, logq, target_logq, targets)
    rows_i = np.arange(len(b))[:, None]
    s_b = b[rows_i, q.s_ids]
    mask = np.zeros_like(b, bool)  # S on the whole row (a target among the ids appears once)
    mask[rows_i, q.s_ids] = True
    outside = np.where(mask, 0.0, np.exp(b))
    p_out = np.where(b > clamped_at, outside, 0.0).sum(axis=1)
    top_b = _top_ids(b, max(TOP_K))
    base = _Base(s_b, q.in_s, p_out, outside.sum(axis=1), -s_b[:, -1], top_b, np.exp(b.max(axis=1)))
    return _records(base, q, clamped_at)


def reduce_topk_both(
    records: np.ndarray,
    keep: int,
    clamped_at: float,
    ids: np.ndarray,
    logq: np.ndarray,
    target_logq: np.ndarray,
    targets,
) -> TokenRecords:
    """The same against a top-K base file's records (codec/topk_records.py): S is then the
    compared model's returned ids the base file also holds, and the target (whose code every
    record keeps); the base's mass outside S is its stored rest plus its kept entries not in S."""
    rest, b_target, ids_b, b_kept = _split(records, keep)
    q = _Compared(ids, logq, target_logq, targets)
    r, width = q.s_ids.shape
    s_b = np.full((r, width), -np.inf)
    in_b = np.zeros((r, width), bool)
    for j in range(keep):  # the base's log-prob of each id of S it holds
        hit = q.s_ids == ids_b[:, j : j + 1]
        s_b = np.where(hit, b_kept[:, j : j + 1], s_b)
        in_b |= hit
    is_target = q.s_ids == np.asarray(targets, np.int64)[:, None]
    s_b = np.where(is_target, b_target[:, None], s_b)
    in_s = q.in_s & (in_b | is_target)
    total = np.exp(b_kept).sum(axis=1) + rest
    p_out = np.maximum(total - np.where(in_s, np.exp(s_b), 0.0).sum(axis=1), 0.0)
    base = _Base(s_b, in_s, p_out, p_out, -b_target, ids_b, np.exp(b_kept[:, 0]))
    return _records(base, q, clamped_at)


class _Compared:
    """The compared model on S: the returned ids and the target as one more column (``in_s``
    False where it repeats a returned id, or for an id the server named ambiguously)."""

    def __init__(self, ids, logq, target_logq, targets):
        targets = np.asarray(targets, np.int64)
        known = ids >= 0
        extra = ~(ids == targets[:, None]).any(axis=1)
        self.ids, self.k = ids, ids.shape[1]
        self.s_ids = np.concatenate([np.where(known, ids, targets[:, None]), targets[:, None]], axis=1)
        self.s_logq = np.concatenate([logq.astype(np.float64), np.asarray(target_logq, np.float64)[:, None]], axis=1)
        self.in_s = np.concatenate([known, extra[:, None]], axis=1)
        self.target_logq = np.asarray(target_logq, np.float64)
        # the compared model's top-1 log-prob is among any top K the server returns: exact
        self.ptop = np.exp(np.where(known, logq.astype(np.float64), -np.inf).max(axis=1, initial=-np.inf))


class _Base:
    """The base on S and around it: its log-probs at S's columns, which columns are in S, its
    mass outside S (without and with clamped entries), its target NLL, top ids and top-1 p."""

    def __init__(self, s_b, in_s, p_out, p_out_all, nll_base, top_ids, ptop):
        self.s_b, self.in_s, self.p_out, self.p_out_all = s_b, in_s, p_out, p_out_all
        self.nll_base, self.top_ids, self.ptop = nll_base, top_ids, ptop


def _records(base: _Base, cq: _Compared, clamped_at: float) -> TokenRecords:
    """The bounds, the interval, the estimate and the exact values from S and one bucket."""
    in_s, p_out, p_out_all = base.in_s, base.p_out, base.p_out_all
    s_b = np.where(in_s, base.s_b, 0.0)  # outside S a column's value is never read
    s_logq, k = cq.s_logq, cq.k
    kept = s_b > clamped_at
    q = np.where(in_s, np.exp(s_logq), 0.0)
    rest = 1.0 - q.sum(axis=1)
    lo, hi = np.maximum(rest - REST_EPS, 0.0), rest + REST_EPS
    p_s = np.where(in_s & kept, np.exp(s_b), 0.0)
    # KLD's bucket P log(P/R) falls as R grows; reverse KLD's R log(R/P) is least at R = P/e and
    # JSD's at R = P (both convex in R)
    kld = np.where(in_s & kept, p_s * (s_b - s_logq), 0.0).sum(axis=1) + _bucket(p_out, hi)
    r_rev = np.clip(p_out_all / np.e, lo, hi)
    rkld = np.where(in_s, q * (s_logq - s_b), 0.0).sum(axis=1)
    rkld += np.where(p_out_all > 0, _bucket(r_rev, np.maximum(p_out_all, 1e-300)), 0.0)
    m_s = np.where(p_s + q > 0, (p_s + q) / 2, 1.0)
    jsd = 0.5 * np.where(in_s, _bucket(p_s, m_s) + _bucket(q, m_s), 0.0).sum(axis=1)
    r_js = np.clip(p_out, lo, hi)
    m_out = np.maximum((p_out + r_js) / 2, 1e-300)
    jsd += 0.5 * (_bucket(p_out, m_out) + _bucket(r_js, m_out))
    # total variation counts a clamped base entry as p = 0, as KLD does
    tv_s = 0.5 * np.abs(p_s - q).sum(axis=1)
    gap = np.maximum(np.maximum(lo - p_out, p_out - hi), 0.0)  # |P - R| at its least over R's interval
    ids, top_b = cq.ids, base.top_ids
    return to_records(
        {
            "nll": -cq.target_logq,
            "nll_base": base.nll_base,
            "kld": kld,
            "dp": np.exp(cq.target_logq) - np.exp(-base.nll_base),
            "same_top": ids[:, 0] == top_b[:, 0],
            "rkld": rkld,
            "jsd": jsd,
            **{f"top{n}": _overlap(ids, top_b, n) for n in TOP_K},
            "ptop_base": base.ptop,
            "ptop_q": cq.ptop,
            "kld_tail": p_out * _band_kld(p_s[:, k // 2 : k], q[:, k // 2 : k]),
            "top1_q": ids[:, 0],
            "top1_base": top_b[:, 0],
            "tv": tv_s + 0.5 * gap,
            "tv_hi": tv_s + 0.5 * (p_out + hi),
            "p_out": p_out,
            "same_sample": (p_s * q).sum(axis=1),  # over S: the products outside it unknown, a lower bound
        }
    )


def _split(records: np.ndarray, keep: int):
    """(rest mass, the target's log-prob, ids, the kept entries' log-probs) of uint16 top-K
    records; log-probs decoded in float32, as every reader decodes them, then float64."""
    from kldtool.codec.topk_records import HEAD

    rec = np.ascontiguousarray(records).view(np.uint16)
    f32 = np.ascontiguousarray(rec[:, :6]).view(np.float32)
    ids = np.ascontiguousarray(rec[:, HEAD : HEAD + 2 * keep]).view(np.uint32).astype(np.int64)
    codes = rec[:, HEAD + 2 * keep : HEAD + 3 * keep].astype(np.float32)
    tcode = rec[:, 6].astype(np.float32)
    scale, low = f32[:, 0], f32[:, 1]
    b_kept = (codes * scale[:, None] + low[:, None]).astype(np.float64)
    b_target = (tcode * scale + low).astype(np.float64)
    return f32[:, 2].astype(np.float64), b_target, ids, b_kept


def _top_ids(b: np.ndarray, n: int) -> np.ndarray:
    """The base's n most probable ids per row, ties to the lower id (rowmath's rule)."""
    import torch

    return top_ids(torch.from_numpy(b.astype(np.float32)), min(n, b.shape[1])).numpy()


def _overlap(ids: np.ndarray, top_b: np.ndarray, n: int) -> np.ndarray:
    """|top-n(q) ∩ top-n(base)|; 0 where the server returned fewer than n."""
    if ids.shape[1] < n:
        return np.zeros(len(ids), np.uint8)
    return (ids[:, :n, None] == top_b[:, None, :n]).sum(axis=(1, 2))


def _band_kld(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KLD between the two models' probabilities over a band of entries, each normalised."""
    ps, qs = p.sum(axis=1, keepdims=True), q.sum(axis=1, keepdims=True)
    ok = (ps > 0) & (qs > 0)
    pn, qn = p / np.where(ok, ps, 1.0), q / np.where(ok, qs, 1.0)
    return np.where(ok[:, 0], _bucket(pn, np.where(qn > 0, qn, 1e-300)).sum(axis=1), 0.0)
