"""Which of a report's quants really differ: each row against the next larger one (``--paired``:
every pair), their mean KLD paired chunk by chunk (``stats/paired.py``); a difference smaller
than the base file's noise floor (``kldtool noise-floor``) is labelled so, however significant.
"""

from __future__ import annotations

from itertools import combinations

from kldtool.analysis.results import ResultRow
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.paired import compare_runs


def _line(a: ResultRow, b: ResultRow, spec: Bootstrap, floor: float | None) -> str:
    head = f"{a.label} vs {b.label}: "
    if a.vectors is None or b.vectors is None:
        return head + "n/a (a result without per-chunk sums; rerun its compare with this kldtool)"
    if a.chunks != b.chunks or len(a.chunks) < 2:
        return head + "n/a (the runs cover different chunks, or one chunk)"
    r = compare_runs(a.vectors, b.vectors, spec)["kld_mean"]
    lo, hi = r["interval_95"]
    if floor is not None and abs(r["difference"]) < floor:
        verdict = f"below the noise floor {floor:.6f}"
    else:
        verdict = "significant" if r["significant"] else "not significant"
    return (
        head + f"mean KLD {r['a']:.6f} vs {r['b']:.6f}, A − B {r['difference']:+.6f} "
        f"[{lo:+.6f}, {hi:+.6f}] 95 %, {verdict}; {a.label} lower in {r['a_wins']} of {r['chunks']} chunks"
    )


def ordering(rows: list[ResultRow], spec: Bootstrap, every: bool = False, floor: float | None = None) -> list[str]:
    """One line per compared pair: rows adjacent in the table (sorted by size), or every pair."""
    if len(rows) < 2 or spec.resamples < 1:
        return []
    pairs = combinations(range(len(rows)), 2) if every else zip(range(len(rows) - 1), range(1, len(rows)))
    what = "every pair" if every else "each row against the next larger one"
    return [f"Mean KLD, paired block bootstrap over chunks ({spec.resamples} resamples, seed {spec.seed}), {what}:"] + [
        "  " + _line(rows[i], rows[j], spec, floor) for i, j in pairs
    ]
