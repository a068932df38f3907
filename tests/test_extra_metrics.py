"""kldtool's metrics beyond llama.cpp's (reverse KLD, JSD, total variation, top-k agreement,
base top-1 buckets) and the block bootstrap, against plain float64 numpy computations of their definitions."""

import numpy as np
import pytest
import torch

from helpers.rows import make_base_rows, random_case
from kldtool.codec import rows_to_torch
from kldtool.reduce import reduce_rows
from kldtool.stats import KldAccumulator, summarize
from kldtool.stats.bootstrap import Bootstrap, block_bootstrap
from kldtool.stats.extra import extra_stats
from kldtool.stats.summary import percentile

pytestmark = pytest.mark.quick


def top_set(x: np.ndarray, k: int) -> set[int]:
    """The k largest entries, equal values taken lowest index first."""
    order = np.lexsort((np.arange(len(x)), -x))
    return set(order[:k].tolist())


def reference(logits: np.ndarray, rows: np.ndarray) -> dict:
    n, v = logits.shape
    head = rows[:, :4].copy().view(np.float32).astype(np.float64)
    b = head[:, :1] * rows[:, 4 : 4 + v].astype(np.float64) + head[:, 1:2]
    x = logits.astype(np.float64)
    logq = x - x.max(1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(1, keepdims=True))
    q = np.exp(logq)
    rkld = (q * (logq - b)).sum(1)
    p = np.where(b > -16, np.exp(b), 0.0)
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        jsd = 0.5 * (np.where(p > 0, p * np.log(p / m), 0).sum(1) + np.where(q > 0, q * np.log(q / m), 0).sum(1))
    # the reducer sees float32 decoded rows: rank on those, as it must
    b32 = b.astype(np.float32)
    overlap = {k: np.array([len(top_set(logits[i], k) & top_set(b32[i], k)) for i in range(n)]) for k in (1, 5, 10)}
    top1 = {"q": [min(top_set(logits[i], 1)) for i in range(n)], "base": [min(top_set(b32[i], 1)) for i in range(n)]}
    tv = 0.5 * np.abs(p - q).sum(1)  # clamped base entries count as 0, as in KLD
    ptop = {"base": np.exp(b.max(1)), "q": q.max(1)}
    same = (p * q).sum(1)  # the probability both sample the same token
    return {"rkld": rkld, "jsd": jsd, "tv": tv, "overlap": overlap, "ptop": ptop, "top1": top1, "same": same}


def reduce(logits, rows, targets):
    return reduce_rows(torch.from_numpy(logits), rows_to_torch(rows), targets)


def check(logits, rows, targets):
    ref = reference(logits, rows)
    r = reduce(logits, rows, targets)
    assert np.allclose(r.rkld, ref["rkld"], rtol=1e-5, atol=5e-7)
    assert np.allclose(r.jsd, ref["jsd"], rtol=1e-5, atol=1e-8)
    assert np.allclose(r.tv, ref["tv"], rtol=1e-5, atol=2e-7)
    assert np.allclose(r.same_sample, ref["same"], rtol=1e-5, atol=1e-8)
    # whole rows: the total variation is known, not an interval; nothing lies outside
    assert np.array_equal(r.tv_hi, r.tv) and not r.p_out.any() and not r.kld_tail.any()
    assert np.array_equal(r.top5, ref["overlap"][5])
    assert np.array_equal(r.top10, ref["overlap"][10])
    # top-1 agreement is same_top: the same tie rule
    assert np.array_equal(r.same_top, ref["overlap"][1] == 1)
    assert np.allclose(r.ptop_base, ref["ptop"]["base"], rtol=1e-6)
    assert np.allclose(r.ptop_q, ref["ptop"]["q"], rtol=1e-6)
    assert r.top1_q.tolist() == ref["top1"]["q"] and r.top1_base.tolist() == ref["top1"]["base"]
    return ref, r


@pytest.mark.parametrize("seed,noise", [(0, 0.7), (1, 0.05), (2, 2.0)])
def test_random_rows_match_float64_reference(seed, noise):
    ref, r = check(*random_case(seed, noise=noise))
    # JSD is bounded by ln 2 and below both KLDs' mean (a sanity relation, not the reference)
    assert (r.jsd <= np.log(2) + 1e-6).all()


def test_adversarial_rows():
    q, rows, targets = random_case(7, n=120, v=301)
    v = q.shape[1]
    q[0, [3, 200, 17]] = q[0].max() + 2  # a three-way tie for the compared top-1
    rows[1, 4 + np.array([10, 250, 30, 31, 32, 33])] = 65535  # a six-way tie on the base's top
    q[2] = 1.25  # all-equal logits: every top-k set is the lowest ids
    rows[3] = make_base_rows(np.zeros((1, v), np.uint16), scale=np.float32(0), min_log_prob=-np.log(v))[0]
    q[4, :] = -1e4
    q[4, 5] = 0.0  # one-hot compared model: q underflows to 0 almost everywhere
    q[5] = -q[5]  # anti-correlated: disjoint top sets, large divergences
    q[6, 7] = -0.0  # signed zero ranks as zero
    q[6, 8] = 0.0
    rows[7, 4 : 4 + v] = 0  # a base row clamped everywhere but its top entry
    rows[7, 4 + 9] = 65535
    check(q, rows, targets)


def test_rows_many_times_wider_than_the_kernels_lanes():
    """Rows of 5,200 entries: each of the Triton kernel's 1,024 (or 512) lanes sees five (or
    ten), and keeps its three largest as top-k candidates. Top sets that share a lane, ties
    inside one lane and across lanes, and rows whose top ten are mostly in one lane (the row
    goes the exact way)."""
    q, rows, targets = random_case(11, n=24, v=5200, noise=0.5)
    lane5 = 5 + 1024 * np.arange(5)
    q[0, lane5] = q[0].max() + np.arange(5, 0, -1)  # the top five, all in lane 5
    q[1, lane5] = q[1].max() + 1  # a five-way tie in one lane
    q[2, [7, 300, 519, 1031]] = q[2].max() + 1  # a tie across lanes
    q[3, lane5[:3]] = q[3].max() + 1  # exactly a lane's three
    q[4] = np.round(q[4] * 2) / 2  # coarse values (bf16-like): ties everywhere
    rows[5, 4 + 9 + 1024 * np.arange(5)] = 65535  # the base's top five in one lane
    rows[6, 4 + 50 * np.arange(40)] = 65535  # a 40-way tie on the base's top
    rows[7, 4 + 5199] = 65535  # the last entry, in the kernel's tail tile
    check(q, rows, targets)


def test_records_taken_later_are_the_same_records():
    """An engine may take a device's records once its next block is queued (defer: pending on
    the Triton path, as they are on a GPU; the host reducers answer at once): the same records."""
    from dataclasses import astuple

    from kldtool.reduce import on_host

    q, rows, targets = random_case(12, n=40, v=1500)
    later = on_host(reduce_rows(torch.from_numpy(q), rows_to_torch(rows), targets, defer=True))
    now = reduce(q, rows, targets)
    assert all(np.array_equal(a, b) for a, b in zip(astuple(later), astuple(now)))


def test_a_model_against_itself_to_the_last_digits():
    """The compared logits are the base row itself: divergences of ~1e-7 (from the clamped
    entries only) must come out to their float64 value, not float32 rounding noise. (Reverse
    KLD is left ~1e-7 from it by the float32 decoding of the base row, which the reducer shares
    with llama.cpp: every p is then off by ~1e-6 relative.)"""
    q, rows, targets = random_case(3, n=40, v=257)
    head = rows[:, :4].copy().view(np.float32)
    b = (head[:, :1] * rows[:, 4 : 4 + 257].astype(np.float32) + head[:, 1:2]).astype(np.float32)
    ref, r = check(b, rows, targets)
    assert np.abs(r.rkld - ref["rkld"]).max() < 3e-7
    assert np.abs(r.jsd - ref["jsd"]).max() < 2e-9
    assert np.abs(r.tv - ref["tv"]).max() < 1e-6
    assert (r.top5 == 5).all() and (r.top10 == 10).all()


def _accumulate(case, chunk_size=30):
    q, rows, targets = case
    acc = KldAccumulator()
    for i, a in enumerate(range(0, len(targets), chunk_size)):
        sl = slice(a, a + chunk_size)
        acc.add(reduce(q[sl], rows[sl], targets[sl]), i)
    return acc


def test_summaries_and_top1_buckets_match_reference():
    case = random_case(4, n=600, v=211, noise=0.4)
    ref = reference(case[0], case[1])
    acc = _accumulate(case)
    e = extra_stats(acc, summarize(acc).same_top)
    n = len(case[2])

    def mu(a):
        a = np.asarray(a, np.float64)
        return a.mean(), np.sqrt(((a * a).mean() - a.mean() ** 2) / (n - 1))

    for key, want in (
        ("rkld_mean", mu(ref["rkld"])),
        ("jsd_mean", mu(ref["jsd"])),
        ("same_sample_p", mu(ref["same"])),
        ("tv", mu(ref["tv"])),
        ("5", mu(ref["overlap"][5] / 5)),
        ("10", mu(ref["overlap"][10] / 10)),
    ):
        got = e[key] if key.endswith(("mean", "_p")) else e["tv"]["mean"] if key == "tv" else e["top_k_agreement"][key]
        assert got["value"] == pytest.approx(want[0], rel=1e-3, abs=1e-7)
        assert got["uncertainty"] == pytest.approx(want[1], rel=1e-2)
    tv = e["tv"]
    assert tv["exact"] and tv["mean_upper"] == pytest.approx(ref["tv"].mean(), rel=1e-3)
    assert tv["acceptance"][1] == pytest.approx(1 - ref["tv"].mean(), rel=1e-4)
    assert tv["median"] == pytest.approx(np.median(ref["tv"]), rel=1e-3)
    assert tv["p99"] == pytest.approx(np.percentile(ref["tv"], 99), rel=1e-3)
    kld = acc.per_token("kld").astype(np.float64)
    edges = [0, 0.25, 0.5, 0.75, 0.95]
    which = np.searchsorted(edges, ref["ptop"]["base"], side="right") - 1
    for i, bucket in enumerate(e["top1_buckets"]):
        sel = kld[which == i]
        assert bucket["count"] == len(sel)
        assert bucket["share"] == pytest.approx(len(sel) / n)
        if len(sel):
            assert bucket["kld_mean"] == pytest.approx(sel.mean(), rel=1e-6)
            assert bucket["kld_99"] == pytest.approx(np.percentile(sel, 99), rel=1e-4, abs=1e-6)
    assert sum(b["count"] for b in e["top1_buckets"]) == n
    c, shift = e["confidence"], ref["ptop"]["q"] - ref["ptop"]["base"]
    assert c["ptop_q_mean"] == pytest.approx(ref["ptop"]["q"].mean(), rel=1e-6)
    assert c["ptop_base_mean"] == pytest.approx(ref["ptop"]["base"].mean(), rel=1e-6)
    assert c["shift"]["value"] == pytest.approx(shift.mean(), rel=1e-5, abs=1e-9)
    assert c["shift"]["uncertainty"] == pytest.approx(shift.std(ddof=1) / np.sqrt(n), rel=1e-2)
    # the bucket rule itself, on values at the edges
    from kldtool.stats.extra import top1_buckets

    got = top1_buckets(np.array([0.0, 0.25, 0.7499, 0.95, 1.0, 1.0000001], np.float32), np.ones(6, np.float32))
    assert [b["count"] for b in got] == [1, 1, 1, 0, 3]
    assert percentile(np.ones(1, np.float32), 0.99) == 1.0


def test_bootstrap_matches_resampling_tokens_by_hand():
    acc = _accumulate(random_case(5, n=450, v=97, noise=0.3))
    spec = Bootstrap(resamples=300, seed=42)
    got = block_bootstrap(acc.chunk_vectors, spec)
    # by hand: the same draws, each resample's tokens gathered and averaged in float64
    kld = acc.per_token("kld").astype(np.float64)
    counts = [int(v[-1]) for v in acc.chunk_vectors]
    starts = np.cumsum([0] + counts)
    rng = np.random.default_rng(42)
    means = []
    for start in range(0, 300, 256):
        picks = rng.integers(0, len(counts), size=(min(256, 300 - start), len(counts)))
        for row in picks:
            means.append(np.concatenate([kld[starts[c] : starts[c + 1]] for c in row]).mean())
    assert got["blocks"] == len(counts) and got["resamples"] == 300 and got["seed"] == 42
    # per-token values are float32, the chunk sums float64: the two agree to float32 precision
    assert got["kld_mean"]["standard_error"] == pytest.approx(np.std(means, ddof=1), rel=1e-4)
    lo, hi = np.percentile(means, [2.5, 97.5])
    assert got["kld_mean"]["interval_95"] == pytest.approx([lo, hi], rel=1e-4)
    assert block_bootstrap(acc.chunk_vectors[:1], spec) is None


def test_bootstrap_is_wider_when_chunks_differ():
    """Chunks whose tokens share a chunk-level offset: the i.i.d. formula sees only the token
    spread; resampling chunks sees the spread between chunks as well."""
    rng = np.random.default_rng(0)
    vectors = []
    from kldtool.stats.accumulator import COUNT, SUMS, VECTOR_LEN

    for level in rng.exponential(0.05, 40):
        x = level + rng.exponential(0.01, 100)
        v = np.zeros(VECTOR_LEN)
        v[SUMS.index("kld")], v[SUMS.index("kld2")], v[COUNT] = x.sum(), (x * x).sum(), len(x)
        vectors.append(v)
    total = np.sum(vectors, 0)
    n = total[COUNT]
    iid = np.sqrt((total[SUMS.index("kld2")] / n - (total[SUMS.index("kld")] / n) ** 2) / (n - 1))
    boot = block_bootstrap(vectors, Bootstrap(2000, 1))["kld_mean"]["standard_error"]
    assert boot > 3 * iid
