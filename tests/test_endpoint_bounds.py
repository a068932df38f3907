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
    rec, tail = reduce_quant_topk(
        rows, V, FLOOR, ids, np.take_along_axis(logq, ids, 1), logq[np.arange(R), targets], targets
    )
    slack = 1e-9
    assert (rec.kld <= kld + slack).all() and (rec.rkld <= rkld + slack).all() and (rec.jsd <= jsd + slack).all()
    assert (rec.kld >= -slack).all() and (rec.jsd >= -slack).all()
    if k == V - 1:  # one entry left out: a bucket of one is that entry, so the bounds are the
        # divergences, less what the allowance for R's rounding (1e-6 of mass) takes off: measured 4.7e-6
        for ours, full in ((rec.kld, kld), (rec.rkld, rkld), (rec.jsd, jsd)):
            np.testing.assert_allclose(ours, full, atol=1e-5)
    p_out = tail["p_out"]
    print(f"K={k} sharp={sharp}: bound / full KLD {rec.kld.sum() / kld.sum():.3f}, P_out mean {p_out.mean():.3f}")
    tv = 0.5 * np.abs(np.exp(b) - np.exp(logq)).sum(axis=1)  # every entry, decoded base values
    assert (tail["tv_lo"] <= tv + slack).all() and (tv <= tail["tv_hi"] + slack).all()
    if k == V - 1:
        np.testing.assert_allclose(tail["tv_lo"], tv, atol=1e-5)
    t = np.arange(R), targets
    np.testing.assert_allclose(rec.nll, -logq[t], rtol=1e-6)
    np.testing.assert_allclose(rec.nll_base, -b[t], rtol=1e-6)
    np.testing.assert_allclose(rec.dp, np.exp(logq[t]) - np.exp(b[t]), atol=1e-6)
    assert (rec.same_top == (np.argmax(logq, axis=1) == np.argmax(b, axis=1))).all()
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
