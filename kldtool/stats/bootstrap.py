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


def _statistics(v: np.ndarray) -> dict[str, np.ndarray]:
    """The bootstrapped statistics from summed chunk vectors (rows: resamples)."""
    n = v[:, COUNT]
    col = {k: v[:, i] for i, k in enumerate(SUMS)}
    return {"kld_mean": col["kld"] / n, "ln_ppl_ratio": (col["nll"] - col["base"]) / n,
            "same_top_p": v[:, N_SAME] / n}


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
        weights = np.zeros((size, n_chunks))
        np.add.at(weights, (np.arange(size)[:, None], picks), 1.0)
        for k, x in _statistics(weights @ vectors).items():
            draws.setdefault(k, []).append(x)
    out = {"blocks": n_chunks, "resamples": spec.resamples, "seed": spec.seed, "method": "chunk block bootstrap"}
    for k, parts in draws.items():
        x = np.concatenate(parts)
        lo, hi = np.percentile(x, [2.5, 97.5])
        out[k] = {"standard_error": float(np.std(x, ddof=1)), "interval_95": [float(lo), float(hi)]}
    return out
