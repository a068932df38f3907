"""When a run may stop early: looks at a few window counts, and intervals wide enough for
having looked more than once.

A rule that stops once an interval is narrow enough looks at the data to decide, and a plain
95 % interval checked after every window misses the truth more often than 5 % of the time. Two
things keep the stopped interval honest (docs/metrics.md has the measured coverage):

- The rule looks only at ``first``, ``2·first``, ``4·first``, ... windows and at the last one,
  so a run of N windows has about log2(N / first) + 1 looks, not N.
- Each look's interval is the bootstrap standard error times Student's t quantile for
  ``(1 - level) / looks`` (Bonferroni over the looks) with n - 1 degrees of freedom, so the chance
  that any look's interval misses is at most ``1 - level``. The bootstrap's standard error is
  the plug-in one (its variance divides by n); it is scaled by sqrt(n / (n - 1)), as the t
  quantile assumes, so that a look at a handful of windows is as wide as it should be.

The question asked is the mean over the run's windows (the corpus the base file holds), a finite
population sampled without replacement in a random order: the standard error carries the
finite-population factor sqrt((N - n) / (N - 1)), and at n = N the interval is the exact mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kldtool.stats.bootstrap import Bootstrap, block_bootstrap, chunk_statistics
from kldtool.stats.paired import paired_bootstrap

DEFAULT_FIRST = 16
LEVEL = 0.95
# Relative width every interval has at least: with every window seen it is the exact mean, up to
# the rounding of sums that another run took in another order.
ROUNDING = 1e-12


def _t_cdf(t: float, df: int) -> float:
    """Student's t distribution function for whole degrees of freedom (the closed forms in
    cos(theta), theta = atan(t / sqrt(df)), summed term by term)."""
    theta = math.atan(t / math.sqrt(df))
    c2, total, term = math.cos(theta) ** 2, 0.0, 1.0
    if df % 2:
        for k in range((df - 1) // 2):
            total += term
            term *= c2 * (2 * k + 2) / (2 * k + 3)
        return 0.5 + (theta + math.sin(theta) * math.cos(theta) * total) / math.pi
    for k in range(df // 2):
        total += term
        term *= c2 * (2 * k + 1) / (2 * k + 2)
    return 0.5 + 0.5 * math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """The p quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection;
    the normal one beyond 1000 degrees, where they agree to 3 digits."""
    if df > 1000:
        return NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def looks(first: int, total: int) -> list[int]:
    """The window counts a rule looks at: first, 2·first, 4·first, ... below total, then total."""
    out, n = [], max(1, first)
    while n < total:
        out.append(n)
        n *= 2
    return out + [total]


@dataclass(frozen=True)
class Rule:
    total: int  # the windows in the run's range: the population the mean is over
    first: int = DEFAULT_FIRST
    level: float = LEVEL
    bootstrap: Bootstrap = Bootstrap()

    @property
    def looks(self) -> list[int]:
        return looks(self.first, self.total)

    @property
    def alpha(self) -> float:
        """Each look's two-sided miss rate: Bonferroni over the looks."""
        return (1 - self.level) / len(self.looks)

    def scale(self, n: int) -> float:
        """What a look at n of the windows multiplies the bootstrap's standard error by: the t
        quantile, the plug-in correction and the finite-population factor."""
        return t_quantile(1 - self.alpha / 2, n - 1) * math.sqrt(n / (n - 1)) * self.shrink(n)

    def shrink(self, n: int) -> float:
        """The finite-population factor for n of the ``total`` windows."""
        return math.sqrt(max(0.0, (self.total - n) / (self.total - 1))) if self.total > 1 else 0.0

    def interval(self, vectors) -> dict:
        """Mean KLD of the windows' summed vectors and its interval for the mean over all windows."""
        v = np.asarray(vectors, np.float64)
        mean = float(chunk_statistics(v.sum(axis=0))["kld_mean"])
        if len(v) >= self.total:
            half = ROUNDING * abs(mean)
        elif len(v) < 2:
            half = math.inf
        else:
            se = block_bootstrap(v, self.bootstrap)["kld_mean"]["standard_error"]
            half = self.scale(len(v)) * se
        return self._facts(len(v)) | {"kld_mean": mean, "half_width": half, "interval": [mean - half, mean + half]}

    def paired(self, va, vb) -> dict:
        """A − B of two runs' mean KLD over the same windows, and whether its interval excludes 0."""
        va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
        d = float(chunk_statistics(va.sum(axis=0))["kld_mean"] - chunk_statistics(vb.sum(axis=0))["kld_mean"])
        if len(va) < 2:
            half = math.inf
        elif len(va) >= self.total:
            half = ROUNDING * abs(d)
        else:
            draws = paired_bootstrap(va, vb, self.bootstrap)["kld_mean"]
            half = self.scale(len(va)) * float(np.std(draws, ddof=1))
        return self._facts(len(va)) | {
            "difference": d,
            "interval": [d - half, d + half],
            "significant": bool(abs(d) > half),
        }

    def _facts(self, n: int) -> dict:
        return {"windows": n, "of": self.total, "level": self.level, "looks": len(self.looks)}

    def describe(self) -> dict:
        return {
            "first": self.first,
            "looks_at": self.looks,
            "level": self.level,
            "alpha_per_look": self.alpha,
            "method": "block-bootstrap standard error x sqrt(n/(n-1)) x Student t (n-1 df) at the "
            "Bonferroni level over the looks x finite-population factor",
        }


def target_met(facts: dict, rel: float) -> bool:
    """Whether an interval from :meth:`Rule.interval` is at most ``rel`` of its mean on each side."""
    return facts["half_width"] <= rel * abs(facts["kld_mean"])
