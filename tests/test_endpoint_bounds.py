"""The endpoint engine's records from a compared model known only by its top-K log-probs
(reduce/quant_topk.py), against a float64 numpy computation over the whole rows: the exact
statistics equal it, KLD, reverse KLD and JSD never exceed it, reaching it when the top K
leave a single entry out, and the total variation lies in its interval."""

import numpy as np
import pytest

from kldtool.codec.rows import decode_np, encode_np
from kldtool.reduce.quant_topk import reduce_quant_topk

pytestmark = pytest.mark.quick

V, R, FLOOR = 512, 64, -16.0


def _rows(seed: int, sharp: float):
    rng = np.random.default_rng(seed)
    base = rng.normal(0, sharp, (R, V)).astype(np.float32)
    quant = base + rng.normal(0, 0.4, (R, V)).astype(np.float32)  # a quant's damage
    rows, _ = encode_np(base)
    logq = quant.astype(np.float64) - np.logaddexp.reduce(quant.astype(np.float64), axis=1)[:, None]
    return rows, logq, rng.integers(0, V, R)


def _full(rows, logq):
    """Float64 KLD, reverse KLD and JSD over every entry of the decoded base rows, clamped
    entries counting 0 in KLD and JSD and at their decoded value in reverse KLD."""
    b = decode_np(rows, V).astype(np.float64)
    p, q = np.where(b > FLOOR, np.exp(b), 0.0), np.exp(logq)
    with np.errstate(divide="ignore", invalid="ignore"):
        kld = np.where(p > 0, p * (np.log(p) - logq), 0.0).sum(axis=1)
        m = (p + q) / 2
        jsd = 0.5 * (np.where(p > 0, p * np.log(p / m), 0.0) + q * np.log(q / m)).sum(axis=1)
    rkld = (q * (logq - b)).sum(axis=1)
    return b, kld, rkld, jsd


@pytest.mark.parametrize("k", [1, 5, 20, 64, V - 1])
@pytest.mark.parametrize("sharp", [1.0, 4.0])
def test_bounds_never_exceed_the_full_divergences_and_the_rest_is_exact(k, sharp):
    rows, logq, targets = _rows(k, sharp)
    b, kld, rkld, jsd = _full(rows, logq)
    ids = np.argsort(-logq, axis=1, kind="stable")[:, :k]
    rec = reduce_quant_topk(rows, V, FLOOR, ids, np.take_along_axis(logq, ids, 1), logq[np.arange(R), targets], targets)
    slack = 1e-9
    assert (rec.kld <= kld + slack).all() and (rec.rkld <= rkld + slack).all() and (rec.jsd <= jsd + slack).all()
    assert (rec.kld >= -slack).all() and (rec.jsd >= -slack).all()
    if k == V - 1:  # one entry left out: a bucket of one is that entry, so the bounds are the
        # divergences, less what the allowance for R's rounding (1e-6 of mass) takes off: measured 4.7e-6
        for ours, full in ((rec.kld, kld), (rec.rkld, rkld), (rec.jsd, jsd)):
            np.testing.assert_allclose(ours, full, atol=1e-5)
    p_out = rec.p_out
    print(f"K={k} sharp={sharp}: bound / full KLD {rec.kld.sum() / kld.sum():.3f}, P_out mean {p_out.mean():.3f}")
    tv = 0.5 * np.abs(np.where(b > FLOOR, np.exp(b), 0.0) - np.exp(logq)).sum(axis=1)  # clamped entries: p = 0
    assert (rec.tv <= tv + slack).all() and (tv <= rec.tv_hi + slack).all()
    if k == V - 1:
        np.testing.assert_allclose(rec.tv, tv, atol=1e-5)
    # the tail estimate: P_out times a KLD, so never negative, and 0 where nothing is outside S
    assert (rec.kld_tail >= 0).all() and (rec.kld_tail <= p_out * 50).all()
    t = np.arange(R), targets
    np.testing.assert_allclose(rec.nll, -logq[t], rtol=1e-6)
    np.testing.assert_allclose(rec.nll_base, -b[t], rtol=1e-6)
    np.testing.assert_allclose(rec.dp, np.exp(logq[t]) - np.exp(b[t]), atol=1e-6)
    assert (rec.same_top == (np.argmax(logq, axis=1) == np.argmax(b, axis=1))).all()
    np.testing.assert_allclose(rec.ptop_q, np.exp(logq.max(axis=1)), rtol=1e-6)  # any K holds the top 1
    np.testing.assert_allclose(
        p_out, [np.exp(b[i][b[i] > FLOOR]).sum() - _in_s(b[i], ids[i], targets[i]) for i in range(R)], atol=1e-9
    )
    if k >= 10:
        top = lambda x, n: [set(np.argsort(-row, kind="stable")[:n]) for row in x]  # noqa: E731
        want = [len(a & c) for a, c in zip(top(b, 10), top(logq, 10))]
        assert rec.top10.tolist() == want


def _in_s(b_row, ids_row, target):
    s = set(ids_row.tolist()) | {int(target)}
    return sum(np.exp(b_row[i]) for i in s if b_row[i] > FLOOR)


def test_entries_known_only_by_an_ambiguous_text_stay_bounds():
    """A server that keys its top log-probs by text (the legacy echo form) may name an entry
    several tokens share: its id is -1 and it joins the bucket. Every bound stays a bound and
    the total variation's interval still holds the true value; the target's NLL stays exact."""
    rows, logq, targets = _rows(9, 2.0)
    b, kld, rkld, jsd = _full(rows, logq)
    ids = np.argsort(-logq, axis=1, kind="stable")[:, :20]
    lps = np.take_along_axis(logq, ids, 1)
    blurred = ids.copy()
    blurred[:, 1::3] = -1  # every third entry from the second on: unknown id, known log-prob
    got = reduce_quant_topk(rows, V, FLOOR, blurred, lps, logq[np.arange(R), targets], targets)
    sharp = reduce_quant_topk(rows, V, FLOOR, ids, lps, logq[np.arange(R), targets], targets)
    slack = 1e-9
    assert (got.kld <= sharp.kld + slack).all() and (got.kld <= kld + slack).all()
    assert (got.rkld <= rkld + slack).all() and (got.jsd <= jsd + slack).all()
    tv = 0.5 * np.abs(np.where(b > FLOOR, np.exp(b), 0.0) - np.exp(logq)).sum(axis=1)
    assert (got.tv <= tv + slack).all() and (tv <= got.tv_hi + slack).all()
    assert (got.p_out >= sharp.p_out).all() and np.array_equal(got.nll, sharp.nll)


@pytest.mark.parametrize("keep,k", [(10, 5), (64, 20), (256, 64)])
def test_a_top_k_server_against_a_top_k_base_file(keep, k):
    """Two providers through one reference: a top-K base file (codec/topk_records.py's own
    encoder) against a compared model known by its top K. S is what both know plus the
    target; every bound stays below the float64 divergence of the whole rows, the total
    variation's interval holds it, NLL and Δp are exact."""
    import torch

    from kldtool.codec.rows import Coding
    from kldtool.codec.topk_records import encode_topk_torch
    from kldtool.reduce.quant_topk import reduce_topk_both

    rng = np.random.default_rng(keep + k)
    base = rng.normal(0, 2.0, (R, V)).astype(np.float32)
    quant = base + rng.normal(0, 0.4, (R, V)).astype(np.float32)
    targets = rng.integers(0, V, R)
    records, _ = encode_topk_torch(torch.from_numpy(base), targets, Coding("llamacpp", keep=keep))
    logp = base.astype(np.float64) - np.logaddexp.reduce(base.astype(np.float64), axis=1)[:, None]
    logq = quant.astype(np.float64) - np.logaddexp.reduce(quant.astype(np.float64), axis=1)[:, None]
    p, q = np.exp(logp), np.exp(logq)
    kld, rkld = (p * (logp - logq)).sum(1), (q * (logq - logp)).sum(1)
    m = (p + q) / 2
    jsd = 0.5 * (p * np.log(p / m) + q * np.log(q / m)).sum(1)
    tv = 0.5 * np.abs(p - q).sum(1)
    ids = np.argsort(-logq, axis=1, kind="stable")[:, :k]
    t = np.arange(R), targets
    got = reduce_topk_both(
        records.numpy().view(np.uint16), keep, FLOOR, ids, np.take_along_axis(logq, ids, 1), logq[t], targets
    )
    # the stored codes' rounding (2.4e-4 nats a step) moves p on S by about 1e-4 relative
    slack = 1e-4
    assert (got.kld <= kld + slack).all() and (got.rkld <= rkld + slack).all() and (got.jsd <= jsd + slack).all()
    assert (got.tv <= tv + slack).all() and (tv <= got.tv_hi + slack).all()
    np.testing.assert_allclose(got.nll, -logq[t], rtol=1e-6)
    np.testing.assert_allclose(got.nll_base, -logp[t], atol=2e-4)
    assert (got.p_out >= 0).all() and (got.p_out <= 1 + 1e-6).all()
    print(f"keep {keep}, K {k}: bound / full KLD {got.kld.sum() / kld.sum():.3f}, P_out {got.p_out.mean():.3f}")
