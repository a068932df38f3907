"""kldtool's statistics beyond llama.cpp's: the means reduce/statistics.py declares (reverse
KLD, JSD, ...), total variation, top-k agreement, KLD by the base's top-1 probability and the
shift in confidence (definitions in docs/metrics.md)."""

from __future__ import annotations

import numpy as np

from kldtool.reduce.statistics import STATISTICS
from kldtool.stats.accumulator import KldAccumulator
from kldtool.stats.summary import mean_unc, percentile

# The last bucket is closed: a base top-1 probability of 1 (to float rounding) belongs to it.
TOP1_BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.95), (0.95, 1.0))


def extra_stats(acc: KldAccumulator, same_top: tuple[float, float]) -> dict:
    """``same_top``: llama.cpp's same top p (value, uncertainty), which is top-1 agreement."""
    s, n = acc.sums, acc.count

    def overlap(k: int) -> dict:
        m, u = mean_unc(s[f"top{k}"] / k, s[f"top{k}_2"] / (k * k), n)
        return {"value": m, "uncertainty": u}

    return {
        **means(acc),
        "top_k_agreement": {
            "1": {"value": same_top[0], "uncertainty": same_top[1]},
            "5": overlap(5),
            "10": overlap(10),
        },
        "tv": tv_stats(acc),
        "top1_buckets": top1_buckets(acc.per_token("ptop_base"), acc.per_token("kld")),
        "confidence": confidence(acc),
    }


def means(acc: KldAccumulator) -> dict:
    """The mean with llama.cpp's ± of each statistic that declares one (reduce/statistics.py),
    from its first two sums: of the values and of their squares."""
    s, n = acc.sums, acc.count
    out = {}
    for stat in STATISTICS:
        if stat.mean:
            total, squares = list(stat.sums)[:2]
            out[stat.mean] = dict(zip(("value", "uncertainty"), mean_unc(s[total], s[squares], n)))
    return out


def confidence(acc: KldAccumulator) -> dict:
    """Both models' mean top-1 probability and the shift between them, with llama.cpp's ±: a
    quant that grows over- or under-confident moves it whichever token it picks."""
    s, n = acc.sums, acc.count
    shift, unc = mean_unc(s["ptop_q"] - s["ptop_base"], s["dptop2"], n)
    return {
        "ptop_q_mean": s["ptop_q"] / n if n else None,
        "ptop_base_mean": s["ptop_base"] / n if n else None,
        "shift": {"value": shift, "uncertainty": unc},
    }


def tv_stats(acc: KldAccumulator) -> dict:
    """Total variation: its mean with llama.cpp's ±, median and 99 %, and the speculative
    acceptance rate 1 - TV. Where the compared rows are known in part each token's TV is an
    interval: ``mean`` is then the mean of its low ends, ``mean_upper`` of its high ends, and
    the percentiles are the low ends'."""
    s, n = acc.sums, acc.count
    mean, unc = mean_unc(s["tv"], s["tv2"], n)
    upper = s["tv_hi"] / n if n else 0.0
    v = np.sort(acc.per_token("tv"))
    return {
        "mean": {"value": mean, "uncertainty": unc},
        "mean_upper": upper,
        "exact": bool(s["tv_hi"] == s["tv"]),
        "median": percentile(v, 0.5) if len(v) else None,
        "p99": percentile(v, 0.99) if len(v) else None,
        "acceptance": [1.0 - upper, 1.0 - mean],
    }


def outside_mass(acc: KldAccumulator) -> dict:
    """The base's probability outside the entries known on both sides (P_out): mean and 99 %."""
    v = np.sort(acc.per_token("p_out"))
    return {
        "mean": acc.sums["p_out"] / acc.count if acc.count else None,
        "p99": percentile(v, 0.99) if len(v) else None,
    }


def top1_buckets(ptop: np.ndarray, kld: np.ndarray) -> list[dict]:
    """Share of tokens, mean KLD and 99 % KLD for each bucket of the base's top-1 probability."""
    out = []
    n = max(len(ptop), 1)
    for i, (lo, hi) in enumerate(TOP1_BUCKETS):
        last = i == len(TOP1_BUCKETS) - 1
        mask = (ptop >= lo) if last else (ptop >= lo) & (ptop < hi)
        v = np.sort(kld[mask])
        out.append(
            {
                "range": [lo, hi],
                "count": int(len(v)),
                "share": len(v) / n,
                "kld_mean": float(np.mean(v, dtype=np.float64)) if len(v) else None,
                "kld_99": percentile(v, 0.99) if len(v) else None,
            }
        )
    return out
