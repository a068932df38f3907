"""The stopping rule's numbers against a plain float64 numpy computation of what
stats/sequential.py documents: looks at first·2^k, Bonferroni z, the chunk block bootstrap's
standard error, the finite-population factor."""

import numpy as np
import pytest

from kldtool.stats.accumulator import COUNT, SUMS, VECTOR_LEN
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.sequential import Rule, looks, t_quantile, target_met

pytestmark = pytest.mark.quick

KLD = SUMS.index("kld")
# Student's t quantiles (p, degrees of freedom) as statistics textbooks print them.
T_TABLE = {
    (0.975, 1): 12.706,
    (0.975, 2): 4.303,
    (0.975, 5): 2.571,
    (0.975, 10): 2.228,
    (0.975, 30): 2.042,
    (0.995, 1): 63.657,
    (0.995, 5): 4.032,
    (0.995, 15): 2.947,
    (0.995, 30): 2.750,
    (0.999, 10): 4.144,
    (0.999, 30): 3.385,
}


def _vectors(n: int, seed: int) -> np.ndarray:
    """Chunk vectors of windows with 100-300 tokens and heavy-tailed KLD sums."""
    rng = np.random.default_rng(seed)
    v = np.zeros((n, VECTOR_LEN))
    v[:, COUNT] = rng.integers(100, 300, n)
    v[:, KLD] = v[:, COUNT] * rng.lognormal(-3, 0.7, n)
    return v


def _bootstrap_se(k: np.ndarray, c: np.ndarray, resamples: int, seed: int) -> float:
    picks = np.random.default_rng(seed).integers(0, len(k), size=(resamples, len(k)))
    means = k[picks].sum(axis=1) / c[picks].sum(axis=1)
    return float(np.std(means, ddof=1))


def test_looks_double_from_the_first_and_end_at_the_total():
    assert looks(16, 160) == [16, 32, 64, 128, 160]
    assert looks(16, 16) == [16]
    assert looks(16, 10) == [10]


@pytest.mark.parametrize("n, total", [(20, 160), (64, 64 * 3), (7, 9)])
def test_interval_is_bonferroni_z_times_the_block_bootstraps_se_times_the_fpc(n, total):
    v = _vectors(n, seed=n)
    rule = Rule(total, 4, bootstrap=Bootstrap(500, 3))
    got = rule.interval(v)
    k, c = v[:, KLD], v[:, COUNT]
    mean = k.sum() / c.sum()
    t = t_quantile(1 - 0.025 / len(looks(4, total)), n - 1)
    half = t * _bootstrap_se(k, c, 500, 3) * np.sqrt(n / (n - 1)) * np.sqrt((total - n) / (total - 1))
    assert got["kld_mean"] == pytest.approx(mean, rel=1e-12)
    assert got["half_width"] == pytest.approx(half, rel=1e-9)
    assert got["interval"] == pytest.approx([mean - half, mean + half], rel=1e-9)
    assert target_met(got, half / mean * 1.001) and not target_met(got, half / mean * 0.999)


def test_every_window_seen_is_the_exact_mean_and_one_window_knows_nothing():
    v = _vectors(12, seed=1)
    whole = Rule(12, 4).interval(v)
    assert whole["half_width"] == pytest.approx(1e-12 * whole["kld_mean"])  # the rounding of sums only
    assert Rule(12, 4).interval(v[:1])["half_width"] == float("inf")


def test_t_quantiles_match_the_printed_tables():
    for (p, df), want in T_TABLE.items():
        assert t_quantile(p, df) == pytest.approx(want, abs=6e-4)
    assert t_quantile(0.975, 5000) == pytest.approx(1.95996, abs=1e-5)  # the normal's, beyond 1000


def test_paired_difference_uses_one_resample_for_both_runs():
    a = _vectors(30, seed=2)
    b = a.copy()
    b[:, KLD] *= 1.05  # B is A plus 5 % in every window: the paired interval is tight around it
    rule = Rule(120, 4, bootstrap=Bootstrap(400, 0))
    got = rule.paired(b, a)
    d = (b[:, KLD].sum() - a[:, KLD].sum()) / a[:, COUNT].sum()
    picks = np.random.default_rng(0).integers(0, 30, size=(400, 30))
    diffs = (b[:, KLD][picks].sum(1) - a[:, KLD][picks].sum(1)) / a[:, COUNT][picks].sum(1)
    half = t_quantile(1 - 0.025 / len(looks(4, 120)), 29) * np.std(diffs, ddof=1) * np.sqrt(30 / 29) * np.sqrt(90 / 119)
    assert got["difference"] == pytest.approx(d, rel=1e-12)
    assert got["interval"] == pytest.approx([d - half, d + half], rel=1e-9)
    assert got["significant"]
    assert not rule.paired(a, a)["significant"]
