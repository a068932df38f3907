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
lower bound of the full one (docs/endpoint.md). A base entry at the clamp floor counts as 0 for
KLD and JSD, as the full-row reducers count it, and at its decoded value for reverse KLD.
"""

from __future__ import annotations

import numpy as np

from kldtool.codec.rows import decode_np
from kldtool.reduce.records import TokenRecords, to_records

# The compared model's mass outside S, R = 1 - Σ_S q, is known to within this (float32
# log-probs from the server, summed): each bucket term takes the R in that interval that makes
# it least, so rounding can never lift a bound above the divergence.
REST_EPS = 1e-6


def _bucket(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a log(a / b), 0 where a is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, a * (np.log(np.maximum(a, 1e-300)) - np.log(b)), 0.0)


def reduce_quant_topk(
    rows: np.ndarray, n_vocab: int, floor: float, ids: np.ndarray, logq: np.ndarray, target_logq: np.ndarray, targets
) -> tuple[TokenRecords, dict[str, np.ndarray]]:
    """(records, per row: P_out and the total variation's interval ``tv_lo``..``tv_hi``) for
    uint16 base ``rows`` (R, W) and the compared model's top-K ``ids`` / ``logq`` (R, K, best
    first) and ``target_logq`` (R,) for ``targets`` (R,)."""
    b = decode_np(rows, n_vocab).astype(np.float64)
    r, k = ids.shape
    targets = np.asarray(targets, np.int64)
    logq = logq.astype(np.float64)
    target_logq = np.asarray(target_logq, np.float64)
    # S: the K returned ids and the target (where it is not among them)
    extra = ~(ids == targets[:, None]).any(axis=1)
    s_ids = np.concatenate([ids, targets[:, None]], axis=1)
    s_logq = np.concatenate([logq, target_logq[:, None]], axis=1)
    in_s = np.ones((r, k + 1), bool)
    in_s[:, k] = extra
    rows_i = np.arange(r)[:, None]
    s_b = b[rows_i, s_ids]
    kept = s_b > floor
    p_all = np.exp(b)
    p_kept = np.where(b > floor, p_all, 0.0)
    mask = np.zeros_like(b, bool)  # S on the whole row (a target among the ids appears once)
    mask[rows_i, ids] = True
    mask[np.arange(r), targets] = True
    p_out = np.where(mask, 0.0, p_kept).sum(axis=1)
    p_out_all = np.where(mask, 0.0, p_all).sum(axis=1)
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
    m_s = (p_s + q) / 2
    jsd = 0.5 * (
        np.where(in_s, _bucket(p_s, np.where(m_s > 0, m_s, 1.0)) + _bucket(q, np.where(m_s > 0, m_s, 1.0)), 0.0)
    ).sum(axis=1)
    r_js = np.clip(p_out, lo, hi)
    m_out = np.maximum((p_out + r_js) / 2, 1e-300)
    jsd += 0.5 * (_bucket(p_out, m_out) + _bucket(r_js, m_out))
    nll_base = -b[np.arange(r), targets]
    top_b = np.argsort(-b, axis=1, kind="stable")[:, :10]
    overlaps = [
        np.array([len(set(top_b[i, :n]) & set(ids[i, :n])) for i in range(r)], np.uint8)
        if k >= n
        else np.zeros(r, np.uint8)
        for n in (5, 10)
    ]
    records = to_records(
        [
            -target_logq,
            nll_base,
            kld,
            np.exp(target_logq) - np.exp(nll_base * -1),
            ids[:, 0] == top_b[:, 0],
            rkld,
            jsd,
            *overlaps,
            np.exp(b.max(axis=1)),
            np.zeros(r),
            ids[:, 0],
            top_b[:, 0],
        ]
    )
    p_all_s = np.where(in_s, np.exp(s_b), 0.0)
    tv_s = 0.5 * np.abs(p_all_s - q).sum(axis=1)
    gap = np.maximum(np.maximum(lo - p_out_all, p_out_all - hi), 0.0)  # |P - R| at its least over R's interval
    return records, {"p_out": p_out, "tv_lo": tv_s + 0.5 * gap, "tv_hi": tv_s + 0.5 * (p_out_all + hi)}
