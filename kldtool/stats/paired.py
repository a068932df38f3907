"""Two runs against one base file, paired chunk by chunk: is the difference between them more
than the text's noise?

Every measure here is a ratio of per-chunk sums, so a paired block bootstrap resamples chunks
once and applies the same resample to both runs: what they share (a hard chunk is hard for
both) cancels in A − B, and the interval is that of the difference itself. The draws are
``numpy.random.default_rng(seed).integers(0, n_chunks, (resamples, n_chunks))``, one row per
resample, and the interval is numpy's default percentile of the 2.5th and 97.5th, so anyone can
recompute it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.stats.bootstrap import Bootstrap, chunk_statistics, resample_weights

# Rows of picks turned into weights at once: bounds the (rows, chunks) matrix.
ROWS = 256


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    better: str  # "lower", "higher" or "nearer 0"


MEASURES = (
    Measure("kld_mean", "mean KLD", "lower"),
    Measure("ln_ppl_ratio", "ln PPL ratio", "nearer 0"),
    Measure("same_top_p", "same top p", "higher"),
    Measure("rms_dp", "RMS Δp", "lower"),
)


def _wins(a: np.ndarray, b: np.ndarray, better: str) -> int:
    if better == "lower":
        return int(np.sum(a < b))
    if better == "higher":
        return int(np.sum(a > b))
    return int(np.sum(np.abs(a) < np.abs(b)))


def paired_bootstrap(va: np.ndarray, vb: np.ndarray, spec: Bootstrap) -> dict[str, np.ndarray]:
    """Per measure, A − B in every resample (the same chunks drawn for both)."""
    n = len(va)
    picks = np.random.default_rng(spec.seed).integers(0, n, size=(spec.resamples, n))
    out: dict[str, list[np.ndarray]] = {m.key: [] for m in MEASURES}
    for r0 in range(0, spec.resamples, ROWS):
        weights = resample_weights(picks[r0 : r0 + ROWS], n)
        sa, sb = chunk_statistics(weights @ va), chunk_statistics(weights @ vb)
        for k in out:
            out[k].append(sa[k] - sb[k])
    return {k: np.concatenate(v) for k, v in out.items()}


def compare_runs(va: np.ndarray, vb: np.ndarray, spec: Bootstrap) -> dict[str, dict]:
    """Per measure: A, B, A − B, its 95 % interval and standard error, whether the interval
    excludes 0, and in how many chunks each run is the better one. ``va`` and ``vb`` are the
    runs' chunk vectors over the same chunks, in the same order (at least 2 chunks)."""
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
    whole_a, whole_b = chunk_statistics(va.sum(axis=0)), chunk_statistics(vb.sum(axis=0))
    per_a, per_b = chunk_statistics(va), chunk_statistics(vb)
    draws = paired_bootstrap(va, vb, spec)
    out = {}
    for m in MEASURES:
        lo, hi = np.percentile(draws[m.key], [2.5, 97.5])
        a, b = float(whole_a[m.key]), float(whole_b[m.key])
        out[m.key] = {
            "a": a,
            "b": b,
            "difference": a - b,
            "interval_95": [float(lo), float(hi)],
            "standard_error": float(np.std(draws[m.key], ddof=1)),
            "significant": bool(lo > 0 or hi < 0),
            "better": m.better,
            "chunks": len(va),
            "a_wins": _wins(per_a[m.key], per_b[m.key], m.better),
            "b_wins": _wins(per_b[m.key], per_a[m.key], m.better),
        }
    return out


def sentence(m: Measure, labels: list[str], row: dict) -> str:
    """One plain sentence of a measure's paired comparison, for people."""
    a, b = labels
    lo, hi = row["interval_95"]
    d = row["difference"]
    wins = f"{a} is {m.better} in {row['a_wins']} of {row['chunks']} chunks, {b} in {row['b_wins']}"
    if not row["significant"]:
        return f"{m.label}: no significant difference: {a} − {b} = {d:+.6g} [{lo:+.6g}, {hi:+.6g}], 95 %; {wins}"
    side = "higher" if d > 0 else "lower"
    return (
        f"{m.label}: {a}'s is {side} than {b}'s by {abs(d):.6g} [{min(abs(lo), abs(hi)):.6g}, "
        f"{max(abs(lo), abs(hi)):.6g}], 95 %; {wins}"
    )
