"""Error bars that do not assume independent tokens: a block bootstrap over chunks.

Tokens of one chunk share their context, so their KLDs are correlated and llama.cpp's i.i.d.
uncertainty is too small when chunks differ. Resampling whole chunks (windows, or documents
under the documents protocol) with replacement keeps that correlation. Every resample is a
weighted sum of the per-chunk vectors the accumulator already keeps, so it costs no pass
over the tokens and works the same on merged shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.stats.accumulator import COUNT, N_SAME, SUMS

DEFAULT_RESAMPLES = 1000
# Resamples drawn at once: bounds the (batch, chunks) weight matrix.
BATCH = 256


@dataclass(frozen=True)
class Bootstrap:
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0


# What a run's own error bars are drawn for (``paired.py`` also pairs RMS Δp).
BOOTSTRAPPED = ("kld_mean", "ln_ppl_ratio", "same_top_p")


def chunk_statistics(v: np.ndarray) -> dict[str, np.ndarray]:
    """Mean KLD, ln PPL ratio, same top p and RMS Δp from summed chunk vectors (the last axis:
    one chunk's, or a resample's, or a whole run's sums)."""
    n = v[..., COUNT]
    col = {k: v[..., i] for i, k in enumerate(SUMS)}
    return {
        "kld_mean": col["kld"] / n,
        "ln_ppl_ratio": (col["nll"] - col["base"]) / n,
        "same_top_p": v[..., N_SAME] / n,
        "rms_dp": np.sqrt(col["dp2"] / n),
    }


def resample_weights(picks: np.ndarray, n_chunks: int) -> np.ndarray:
    """(resamples, chunks) counts of how often each resample drew each chunk."""
    weights = np.zeros((len(picks), n_chunks))
    np.add.at(weights, (np.arange(len(picks))[:, None], picks), 1.0)
    return weights


def block_bootstrap(chunk_vectors: list[np.ndarray], spec: Bootstrap) -> dict | None:
    """Standard error and 95 % percentile interval of each statistic, or None when there are
    fewer than two chunks (nothing to resample)."""
    vectors = np.asarray(chunk_vectors, np.float64)
    n_chunks = len(vectors)
    if n_chunks < 2 or spec.resamples < 1:
        return None
    rng = np.random.default_rng(spec.seed)
    draws: dict[str, list[np.ndarray]] = {}
    for start in range(0, spec.resamples, BATCH):
        size = min(BATCH, spec.resamples - start)
        picks = rng.integers(0, n_chunks, size=(size, n_chunks))
        stats = chunk_statistics(resample_weights(picks, n_chunks) @ vectors)
        for k in BOOTSTRAPPED:
            draws.setdefault(k, []).append(stats[k])
    out = {"blocks": n_chunks, "resamples": spec.resamples, "seed": spec.seed, "method": "chunk block bootstrap"}
    for k, parts in draws.items():
        x = np.concatenate(parts)
        lo, hi = np.percentile(x, [2.5, 97.5])
        out[k] = {"standard_error": float(np.std(x, ddof=1)), "interval_95": [float(lo), float(hi)]}
    return out
