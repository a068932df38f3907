"""llama-perplexity's KL-divergence statistics (docs/llama-perplexity-format.md §6), value and uncertainty each."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kldtool.stats.accumulator import KldAccumulator

KLD_PERCENTILES = (
    ("99.9%", 0.999),
    ("99.0%", 0.990),
    ("95.0%", 0.950),
    ("90.0%", 0.900),
    ("10.0%", 0.100),
    (" 5.0%", 0.050),
    (" 1.0%", 0.010),
    (" 0.1%", 0.001),
)
DP_PERCENTILES = (
    ("99.9%", 0.999),
    ("99.0%", 0.990),
    ("95.0%", 0.950),
    ("90.0%", 0.900),
    ("75.0%", 0.750),
    ("25.0%", 0.250),
    ("10.0%", 0.100),
    (" 5.0%", 0.050),
    (" 1.0%", 0.010),
    (" 0.1%", 0.001),
)
MIN_TOKENS_FOR_STATS = 100


def mean_unc(s: float, s2: float, n: int) -> tuple[float, float]:
    if n < 1:
        return 0.0, 0.0
    f = s / n
    d = s2 / n - f * f
    return f, (math.sqrt(d / (n - 1)) if d > 0 and n > 10 else 0.0)


def covariance(sa: float, sb: float, sab: float, n: int) -> float:
    if n < 10:
        return 0.0
    return (sab / n - (sa / n) * (sb / n)) / (n - 1)


def c_sqrt(x: float) -> float:
    """sqrt that yields a negative NaN for negative input, as glibc does (printed "-nan")."""
    return math.sqrt(x) if x >= 0 else -math.nan if not math.isnan(x) else x


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's percentile: float32 fraction, float32 interpolation."""
    v = sorted_values
    f = np.float32(fraction)
    if f <= 0:
        return float(v[0])
    if f >= 1:
        return float(v[-1])
    x = f * np.float32(len(v) - 1)
    i = int(x)
    t = x - np.float32(i)
    return float((np.float32(1) - t) * v[i] + t * v[min(i + 1, len(v) - 1)])


def median(sorted_values: np.ndarray) -> float:
    v, n = sorted_values, len(sorted_values)
    return float(np.float32(0.5) * (v[n // 2] + v[n // 2 - 1])) if n % 2 == 0 else float(v[n // 2])


@dataclass(kw_only=True)
class KldSummary:
    count: int
    ppl_q: tuple[float, float]
    ppl_base: tuple[float, float]
    ln_ratio: tuple[float, float]
    ratio: tuple[float, float]
    diff: tuple[float, float]
    cor: float
    kld_mean: tuple[float, float]
    dp_mean: tuple[float, float]
    rms_dp: tuple[float, float]
    same_top: tuple[float, float]
    kld_quantiles: dict[str, float] = field(default_factory=dict)
    dp_quantiles: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        def pair(p):
            return {"value": p[0], "uncertainty": p[1]}

        return {
            "count": self.count,
            "ppl_q": pair(self.ppl_q),
            "ppl_base": pair(self.ppl_base),
            "cor_ln_ppl": self.cor,
            "ln_ppl_ratio": pair(self.ln_ratio),
            "ppl_ratio": pair(self.ratio),
            "ppl_diff": pair(self.diff),
            "kld_mean": pair(self.kld_mean),
            "kld_quantiles": self.kld_quantiles,
            "dp_mean": pair(self.dp_mean),
            "dp_quantiles": self.dp_quantiles,
            "rms_dp": pair(self.rms_dp),
            "same_top_p": pair(self.same_top),
        }


def _quantiles(values: np.ndarray, table) -> dict[str, float]:
    v = np.sort(values)
    out = {"max": float(v[-1])}
    for label, f in table:
        out[label.strip()] = percentile(v, f)
    out["median"] = median(v)
    out["min"] = float(v[0])
    return out


def summarize(acc: KldAccumulator, with_quantiles: bool = True) -> KldSummary:
    """Every statistic llama-perplexity prints, from an accumulator."""
    s, n = acc.sums, acc.count
    a, ua = mean_unc(s["nll"], s["nll2"], n)
    b, ub = mean_unc(s["base"], s["base2"], n)
    c = covariance(s["nll"], s["base"], s["nll_base"], n)
    ppl, ppl_b = math.exp(a), math.exp(b)
    r = a - b
    ur = c_sqrt(ua * ua + ub * ub - 2.0 * c)
    m2, u2 = mean_unc(s["dp2"], s["dp4"], n)
    rms = math.sqrt(m2)
    same = acc.n_same / n if n else 0.0
    summary = KldSummary(
        count=n,
        ppl_q=(ppl, ppl * ua),
        ppl_base=(ppl_b, ppl_b * ub),
        ln_ratio=(r, ur),
        ratio=(math.exp(r), math.exp(r) * ur),
        diff=(ppl - ppl_b, c_sqrt((ppl * ua) ** 2 + (ppl_b * ub) ** 2 - 2.0 * ppl * ppl_b * c)),
        cor=(c / (ua * ub)) if ua * ub != 0 else math.nan,
        kld_mean=mean_unc(s["kld"], s["kld2"], n),
        dp_mean=mean_unc(s["dp"], s["dp2"], n),
        rms_dp=(rms, (0.5 / rms * u2) if rms > 0 else math.nan),
        same_top=(same, math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else 0.0),
    )
    if with_quantiles and n:
        kld, dp = acc.values()
        summary.kld_quantiles = _quantiles(kld, KLD_PERCENTILES)
        summary.dp_quantiles = _quantiles(dp, DP_PERCENTILES)
    return summary
