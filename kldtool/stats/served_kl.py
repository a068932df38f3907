"""KL(q‖p) of a served model q against its base p, from the tokens q sampled itself.

If x is drawn from q at temperature 1 with nothing cut off, log q(x) − log p(x) has expectation
KL(q‖p) at that position, whatever the context; so the mean of that difference over the tokens
of q's own answers is an unbiased estimate of the reverse KLD averaged over the positions q's
text visits. It needs only what nearly every server returns, the log-prob of each generated
token, and p run locally over the same tokens (``base -f`` on the generated corpus).

A sample (one answer) is the independent unit: its tokens share a context, so the estimate is
a ratio of sums over samples, its standard error the delta method's over samples and its
interval Student's t over samples (a bootstrap drawing whole samples is given beside it).

The estimator holds only if the server samples as asked. ``sampling_check`` tests that: at each
position whose full top K the server named, the rank the sampled token had is an event whose
probability the server itself reported (top-1, second, third to fifth, the rest of the top K,
outside it); over many positions each count must match the summed probabilities within
sampling error. A server that sharpens (a lower temperature) takes the top-1 too often; one
that truncates (top-k, top-p, min-p) never reaches the tail it reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kldtool.stats.bootstrap import BATCH, Bootstrap, resample_weights

# The ranks (0-based, end excluded) whose events the sampling check counts; the last bin is the
# rest of the top K, then "outside" follows.
RANK_BINS = ((0, 1), (1, 2), (2, 5))
BIN_NAMES = ("top-1", "second", "third to fifth")
Z_LIMIT = 4.0  # a bin this many standard errors off fails the check (under 5e-4 by chance for 6 bins)
DEPTH_STARTS = (0, 16, 64, 256, 1024)  # the answer's first token is depth 0


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One answer: per generated token, the served log-prob of the token it sampled and the
    base's; where the base row held the token at its clamp (its log-prob a floor, so the
    difference there is low); the served top K's log-probs (ranked best first, NaN-padded), and
    the sampled token's rank among them (K: outside; -1: the top K was not complete or named an
    entry no id is sure of, so the position is left out of the sampling check)."""

    served: np.ndarray
    base: np.ndarray
    clamped: np.ndarray
    top: np.ndarray
    rank: np.ndarray


def _ratio_draws(num: np.ndarray, den: np.ndarray, spec: Bootstrap) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    n, draws = len(num), []
    both = np.stack([num, den], axis=1)
    for start in range(0, spec.resamples, BATCH):
        size = min(BATCH, spec.resamples - start)
        sums = resample_weights(rng.integers(0, n, size=(size, n)), n) @ both
        draws.append(sums[:, 0] / sums[:, 1])
    return np.concatenate(draws)


def t_quantile(df: int, z: float = 1.959963984540054) -> float:
    """Student's t quantile of ``df`` degrees of freedom at the normal quantile ``z`` (97.5 %):
    exact for 1 and 2, Cornish-Fisher's expansion from 3 on (3.16 for the exact 3.182 at 3,
    2.364 for 2.365 at 7)."""
    p = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def ratio_estimate(num: np.ndarray, den: np.ndarray, spec: Bootstrap) -> dict:
    """Σnum / Σden over independent units, with the delta method's standard error, a 95 %
    interval of Student's t over the units (the bootstrap's percentile interval, also given,
    is too narrow for few units: benchmarks/served_audit_coverage.py measured 86 % at 8)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    value = float(num.sum() / den.sum())
    out = {"value": value, "standard_error": None, "interval_95": None, "bootstrap_95": None, "units": len(num)}
    if len(num) >= 2:
        resid = num - value * den
        se = float(np.sqrt(len(num) / (len(num) - 1) * np.sum(resid**2)) / den.sum())
        half = t_quantile(len(num) - 1) * se
        out["standard_error"], out["interval_95"] = se, [value - half, value + half]
        if spec.resamples > 0:
            lo, hi = np.percentile(_ratio_draws(num, den, spec), [2.5, 97.5])
            out["bootstrap_95"] = [float(lo), float(hi)]
    return out


def reverse_kld(samples: list[Sample], spec: Bootstrap) -> dict:
    """The estimate over all tokens, and by depth in the answer."""
    d = [s.served - s.base for s in samples]
    n = np.array([len(x) for x in d], np.float64)
    out = ratio_estimate(np.array([x.sum() for x in d]), n, spec)
    out["tokens"] = int(n.sum())
    out["samples"] = len(samples)
    out["clamped_tokens"] = int(sum(int(s.clamped.sum()) for s in samples))
    table = []
    for lo, hi in zip(DEPTH_STARTS, (*DEPTH_STARTS[1:], None)):
        parts = [x[lo:hi] for x in d if len(x) > lo]
        if parts:
            cut = ratio_estimate(np.array([p.sum() for p in parts]), np.array([len(p) for p in parts]), spec)
            table.append({"from": lo, "to": hi, **cut, "tokens": int(sum(len(p) for p in parts))})
    out["by_depth"] = table
    return out


def sampling_check(samples: list[Sample]) -> dict:
    """Observed against reported frequencies of the sampled token's rank, per bin (see the
    module's docstring), each with its z score; passes where every |z| < Z_LIMIT."""
    ranks = np.concatenate([s.rank for s in samples]) if samples else np.zeros(0, np.int64)
    tops = np.concatenate([s.top for s in samples]) if samples else np.zeros((0, 1))
    use = ranks >= 0
    ranks, probs = ranks[use], np.exp(np.nan_to_num(tops[use], nan=-np.inf))
    k = probs.shape[1] if probs.ndim == 2 else 0
    bins = [(a, min(b, k)) for a, b in RANK_BINS if a < k]
    if bins and bins[-1][1] < k:
        bins.append((bins[-1][1], k))
    names = list(BIN_NAMES[: len(bins)])
    if len(bins) > len(BIN_NAMES):
        names.append(f"sixth to {k}th")
    rows = []
    for name, (a, b) in zip(names, bins):
        rows.append(_bin(name, (ranks >= a) & (ranks < b), probs[:, a:b].sum(axis=1)))
    if k:
        outside = np.clip(1.0 - probs.sum(axis=1), 0.0, 1.0)
        rows.append(_bin(f"outside the top {k}", ranks >= k, outside))
    worst = max((abs(r["z"]) for r in rows if r["z"] is not None), default=None)
    return {
        "positions": int(use.sum()),
        "left_out": int((~use).sum()),
        "top_k": k,
        "bins": rows,
        "max_abs_z": worst,
        "z_limit": Z_LIMIT,
        "passes": None if worst is None else bool(worst < Z_LIMIT),
    }


def _bin(name: str, hit: np.ndarray, p: np.ndarray) -> dict:
    observed, expected, var = float(hit.sum()), float(p.sum()), float(np.sum(p * (1 - p)))
    n = max(len(hit), 1)
    z = (observed - expected) / np.sqrt(var) if var > 0 else None
    return {
        "bin": name,
        "observed_share": observed / n,
        "expected_share": expected / n,
        "z": None if z is None else float(z),
    }
