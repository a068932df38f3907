"""stats/served_kl.py against exact divergences computed here in float64: random served (q) and
base (p) distributions over a small vocabulary, tokens drawn from q as a server would, the
estimate of KL(q‖p) against the mean of the exact per-position KL(q‖p) over the same positions;
and the sampling check against samplers that sharpen or truncate."""

import numpy as np
import pytest

from kldtool.pipeline.served_audit import sampled_rank
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.served_kl import Sample, reverse_kld, sampling_check

pytestmark = pytest.mark.quick

V, K = 64, 10


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _run(seed: int, samples: int = 48, length: int = 24, temperature: float = 1.0, top_k: int = 0):
    """Samples drawn from q (at ``temperature``, cut to ``top_k`` if asked) while the reported
    log-probs stay q's own; and the exact mean KL(q‖p) over the positions drawn."""
    rng = np.random.default_rng(seed)
    out, exact = [], []
    for _ in range(samples):
        n = int(rng.integers(length // 2, length + 1))  # answers of different lengths
        lq = _log_softmax(rng.normal(0, 2.5, (n, V)))
        lp = _log_softmax(lq + rng.normal(0, 0.3, (n, V)))
        draw = _log_softmax(lq / temperature)
        if top_k:
            cut = np.argsort(-lq, axis=1)[:, top_k:]
            np.put_along_axis(draw, cut, -np.inf, axis=1)
            draw = _log_softmax(draw)
        x = np.array([rng.choice(V, p=np.exp(row)) for row in draw])
        order = np.argsort(-lq, axis=1)[:, :K]
        top_ids, top = order, np.take_along_axis(lq, order, axis=1)
        ranks = np.array([sampled_rank(top_ids[t], top[t], int(x[t])) for t in range(n)])
        at = np.arange(n)
        out.append(Sample(served=lq[at, x], base=lp[at, x], clamped=np.zeros(n, bool), top=top, rank=ranks))
        exact.append(np.sum(np.exp(lq) * (lq - lp), axis=1))
    return out, float(np.concatenate(exact).mean())


def test_the_estimate_is_the_exact_reverse_kld_within_its_error():
    samples, exact = _run(0)
    r = reverse_kld(samples, Bootstrap(500, 0))
    print(r["value"], exact, r["standard_error"], r["interval_95"])
    assert abs(r["value"] - exact) <= 3 * r["standard_error"]
    lo, hi = r["interval_95"]
    assert lo < r["value"] < hi and hi - lo == pytest.approx(2 * 1.96 * r["standard_error"], rel=0.35)
    assert r["tokens"] == sum(len(s.served) for s in samples) and r["samples"] == 48
    assert sum(d["tokens"] for d in r["by_depth"]) == r["tokens"]


def test_its_interval_covers_the_exact_value_as_often_as_it_says():
    """Over 200 seeds, ±1.96 standard errors hold the exact mean in 95 % of runs: at least 90 %
    here (200 draws of a 95 % event fall below 90 % with probability under 1e-3)."""
    hits = 0
    for seed in range(200):
        samples, exact = _run(seed, samples=24, length=12)
        r = reverse_kld(samples, Bootstrap(0, 0))
        hits += abs(r["value"] - exact) <= 1.96 * r["standard_error"]
    print(hits)
    assert hits >= 180


def test_the_sampling_check_passes_a_plain_sampler_and_catches_sharpening_and_truncation():
    plain = sampling_check(_run(1)[0])
    sharp = sampling_check(_run(1, temperature=0.7)[0])
    cut = sampling_check(_run(1, top_k=5)[0])
    print(plain["max_abs_z"], sharp["max_abs_z"], cut["max_abs_z"])
    assert plain["passes"] and plain["left_out"] == 0
    assert not sharp["passes"] and sharp["bins"][0]["observed_share"] > sharp["bins"][0]["expected_share"]
    assert not cut["passes"] and cut["bins"][-1]["observed_share"] == 0 < cut["bins"][-1]["expected_share"]
    assert [b["bin"] for b in plain["bins"]] == [
        "top-1",
        "second",
        "third to fifth",
        "sixth to 10th",
        "outside the top 10",
    ]


def test_a_position_whose_top_k_is_not_complete_is_left_out_whatever_was_drawn():
    ids, top = np.array([3, 5, -1]), np.array([-0.1, -2.0, -3.0])
    assert sampled_rank(ids, top, 3) == -1 and sampled_rank(ids, top, 9) == -1
    full = np.array([3, 5, 7])
    assert sampled_rank(full, top, 5) == 1 and sampled_rank(full, top, 9) == 3
    assert sampled_rank(full, np.array([-0.1, -2.0, np.nan]), 3) == -1


def test_the_t_quantile_is_students():
    """Against the published 97.5 % quantiles of Student's t (any statistics table)."""
    from kldtool.stats.served_kl import t_quantile

    table = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 7: 2.365, 15: 2.131, 30: 2.042, 120: 1.980}
    for df, value in table.items():
        assert t_quantile(df) == pytest.approx(value, rel=0.01), df
