"""Reducer + accumulators + summary against a plain float64 numpy computation of the definitions."""

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kldtool.codec import rows_to_torch
from kldtool.reduce import reduce_rows, reducer_for
from kldtool.stats import KldAccumulator, summarize
from kldtool.stats.summary import median, percentile
from helpers.rows import make_base_rows, random_case as _random_case
from helpers.vocab_models import SHAPES

pytestmark = pytest.mark.quick


def reference(logits: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> dict:
    """The definitions, in float64, one obvious step at a time."""
    n, v = logits.shape
    head = rows[:, :4].copy().view(np.float32).astype(np.float64)
    b = head[:, :1] * rows[:, 4 : 4 + v].astype(np.float64) + head[:, 1:2]
    x = logits.astype(np.float64)
    logq = x - x.max(1, keepdims=True)
    logq = logq - np.log(np.exp(logq).sum(1, keepdims=True))
    idx = np.arange(n)
    nll, nll_b = -logq[idx, targets], -b[idx, targets]
    kld = np.where(b > -16, np.exp(b) * (b - logq), 0.0).sum(1)
    dp = np.exp(-nll) - np.exp(-nll_b)
    same = np.argmax(x, 1) == np.argmax(b, 1)

    def mu(a):
        m = a.mean()
        d = (a * a).mean() - m * m
        return m, (math.sqrt(d / (n - 1)) if d > 0 and n > 10 else 0.0)

    a, ua = mu(nll)
    bb, ub = mu(nll_b)
    cov = ((nll * nll_b).mean() - a * bb) / (n - 1) if n >= 10 else 0.0
    m2, u2 = mu(dp * dp)
    s = same.mean()
    return {
        "ppl_q": (math.exp(a), math.exp(a) * ua),
        "ppl_base": (math.exp(bb), math.exp(bb) * ub),
        "ln_ratio": (a - bb, math.sqrt(max(ua * ua + ub * ub - 2 * cov, 0))),
        "kld_mean": mu(kld),
        "dp_mean": mu(dp),
        "rms_dp": (math.sqrt(m2), 0.5 / math.sqrt(m2) * u2 if m2 > 0 else 0.0),
        "same_top": (s, math.sqrt(s * (1 - s) / (n - 1))),
        "kld": kld,
        "dp": dp,
        "same": same,
    }


def test_the_reducer_under_test():
    """tests/test_reducer_variants.py runs this module again with KLDTOOL_REDUCER forcing the
    torch ops or the Triton kernel (under Triton's CPU interpreter): make sure the reducer
    meant is what ran."""
    kind = os.environ.get("KLDTOOL_REDUCER", "numba")
    assert reducer_for(torch.device("cpu")) == kind
    if kind == "triton":
        from kldtool.reduce import triton_kernel as reduce_triton

        assert type(reduce_triton._reduce_kernel).__name__ == "InterpretedFunction"


def ours(logits, rows, targets):
    acc = KldAccumulator()
    half = len(targets) // 2
    # two adds, as chunks arrive, to exercise the streaming path
    for sl in (slice(0, half), slice(half, None)):
        acc.add(reduce_rows(torch.from_numpy(logits[sl]), rows_to_torch(rows[sl]), targets[sl]))
    return acc, summarize(acc)


def close(a, b, rel=2e-5, abs_=2e-6):
    return abs(a - b) <= abs_ + rel * abs(b)


def check(logits, rows, targets):
    ref = reference(logits, rows, targets)
    acc, s = ours(logits, rows, targets)
    kld, dp = acc.values()
    assert np.allclose(kld, ref["kld"], rtol=2e-5, atol=2e-6)
    assert np.allclose(dp, ref["dp"], rtol=2e-5, atol=2e-6)
    assert acc.n_same == ref["same"].sum()
    for key in ("ppl_q", "ppl_base", "ln_ratio", "kld_mean", "dp_mean", "rms_dp", "same_top"):
        got, want = getattr(s, key), ref[key]
        assert close(got[0], want[0]), (key, got, want)
        assert close(got[1], want[1], rel=1e-3, abs_=1e-6), (key, got, want)
    for label, f in (("99.9%", 0.999), ("90.0%", 0.9), ("1.0%", 0.01)):
        assert close(s.kld_quantiles[label], float(np.percentile(ref["kld"], 100 * f)), rel=1e-4, abs_=1e-5)
        assert close(s.dp_quantiles[label], float(np.percentile(ref["dp"], 100 * f)), rel=1e-4, abs_=1e-5)
    assert close(s.kld_quantiles["median"], float(np.median(ref["kld"])), rel=1e-5)
    assert s.kld_quantiles["max"] == pytest.approx(ref["kld"].max(), rel=1e-5, abs=1e-6)
    assert s.dp_quantiles["min"] == pytest.approx(ref["dp"].min(), rel=1e-5, abs=1e-6)
    return ref, s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_rows_match_float64_reference(seed):
    check(*_random_case(seed))


@pytest.mark.parametrize("vocab", sorted({v for _, v, _ in SHAPES.values()}))
def test_the_vocabularies_users_quantize(vocab):
    """128k-262k entries a row (tests/helpers/vocab_models.py): the tail tiles of vocabularies
    that are no power of two, targets past 65,535."""
    q, rows, targets = _random_case(3, n=12, v=vocab)
    targets[::2] = vocab - 1 - targets[::2] % 1000
    check(q, rows, targets)


def test_adversarial_rows():
    q, rows, targets = _random_case(7, n=120, v=301)
    v = q.shape[1]
    # ties for the argmax in both models: the first index must win
    q[0, [3, 200]] = q[0].max() + 2
    rows[1, 4 + 10] = rows[1, 4 + 250] = 65535
    # all-equal logits in the compared model, and an all-zero-code base row (scale 0)
    q[2] = 1.25
    rows[3] = make_base_rows(np.zeros((1, v), np.uint16), scale=np.float32(0), min_log_prob=-np.log(v))[0]
    # targets far below the clamp floor: code 0
    rows[4:20, 4 + targets[4:20]] = 0
    ref, s = check(q, rows, targets)
    acc, _ = ours(q, rows, targets)
    assert acc.n_same == ref["same"].sum()


@pytest.mark.parametrize("n", [5, 50])
def test_few_tokens(n):
    ref, s = check(*_random_case(11, n=n, v=97))
    if n < 10:
        assert s.kld_mean[1] == 0.0  # llama.cpp reports no uncertainty below 11 tokens


def test_shards_merge_exactly():
    q, rows, t = _random_case(5, n=200, v=333)
    whole, _ = ours(q, rows, t)
    a, _ = ours(q[:70], rows[:70], t[:70])
    b, _ = ours(q[70:], rows[70:], t[70:])
    a.merge(b)
    assert a.count == whole.count and a.n_same == whole.n_same
    for k in whole.sums:
        assert a.sums[k] == pytest.approx(whole.sums[k], rel=1e-12, abs=1e-12)
    assert np.array_equal(a.values()[0], whole.values()[0])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=300),
    st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.25, 0.75, 0.9, 0.95, 0.99, 0.999]),
)
def test_percentile_matches_linear_interpolation(values, f):
    v = np.sort(np.asarray(values, np.float32))
    want = float(np.percentile(v.astype(np.float64), 100 * f))
    span = float(v[-1] - v[0]) + abs(want)
    assert abs(percentile(v, f) - want) <= 1e-5 * span + 1e-6
    assert abs(median(v) - float(np.median(v.astype(np.float64)))) <= 1e-6 * (abs(float(np.median(v))) + 1)
