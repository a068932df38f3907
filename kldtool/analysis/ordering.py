"""Which of a report's quants really differ: each row against the next larger one (``--paired``:
every pair), their mean KLD paired chunk by chunk (``stats/paired.py``); a difference smaller
than the base file's noise floor (``kldtool noise-floor``) is labelled so, however significant.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from kldtool.analysis.results import ResultRow
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.paired import compare_runs


def _line(a: ResultRow, b: ResultRow, spec: Bootstrap, noise_floor: float | None) -> str:
    head = f"{a.label} vs {b.label}: "
    if a.vectors is None or b.vectors is None:
        return head + "n/a (a result without per-chunk sums; rerun its compare with this kldtool)"
    va, vb = common_chunks(a, b)
    if len(va) < 2:
        return head + "n/a (the runs share fewer than two chunks)"
    r = compare_runs(va, vb, spec)["kld_mean"]
    lo, hi = r["interval_95"]
    if noise_floor is not None and abs(r["difference"]) < noise_floor:
        verdict = f"below the noise floor {noise_floor:.6f}"
    else:
        verdict = "significant" if r["significant"] else "not significant"
    return (
        head + f"mean KLD {r['a']:.6f} vs {r['b']:.6f}, A − B {r['difference']:+.6f} "
        f"[{lo:+.6f}, {hi:+.6f}] 95 %, {verdict}; {a.label} lower in {r['a_wins']} of {r['chunks']} chunks"
    )


def common_chunks(a: ResultRow, b: ResultRow) -> tuple[np.ndarray, np.ndarray]:
    """Both runs' vectors over the chunks both scored, in chunk order (runs of one sweep stopped
    after different numbers of windows share the first windows of their order)."""
    if a.chunks == b.chunks:
        return a.vectors, b.vectors
    ia, ib = ({c: i for i, c in enumerate(r.chunks)} for r in (a, b))
    shared = sorted(ia.keys() & ib.keys())
    return a.vectors[[ia[c] for c in shared]], b.vectors[[ib[c] for c in shared]]


def ordering(
    rows: list[ResultRow], spec: Bootstrap, every: bool = False, noise_floor: float | None = None
) -> list[str]:
    """One line per compared pair: rows adjacent in the table (sorted by size), or every pair."""
    if len(rows) < 2 or spec.resamples < 1:
        return []
    pairs = combinations(range(len(rows)), 2) if every else zip(range(len(rows) - 1), range(1, len(rows)))
    what = "every pair" if every else "each row against the next larger one"
    return [f"Mean KLD, paired block bootstrap over chunks ({spec.resamples} resamples, seed {spec.seed}), {what}:"] + [
        "  " + _line(rows[i], rows[j], spec, noise_floor) for i, j in pairs
    ]
