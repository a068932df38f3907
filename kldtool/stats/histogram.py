"""A fixed, log-spaced KLD histogram, small enough for every JSON result, so a report can draw
each quant's KLD distribution without the per-token values."""

from __future__ import annotations

import numpy as np

LOW, HIGH, PER_DECADE = -7, 2, 10  # bins from 1e-7 to 1e2 nats, ten per decade


def kld_histogram(kld: np.ndarray) -> dict:
    """``edges`` (nats), ``counts`` per bin, and the counts of values below the first edge
    (zero and the tiny negatives that rounding gives) and above the last."""
    edges = np.logspace(LOW, HIGH, (HIGH - LOW) * PER_DECADE + 1)
    v = np.asarray(kld, np.float64)
    counts, _ = np.histogram(v, edges)
    return {
        "edges": edges.tolist(),
        "counts": counts.tolist(),
        "below": int(np.count_nonzero(v < edges[0])),
        "above": int(np.count_nonzero(v > edges[-1])),
    }
