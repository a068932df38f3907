"""``kldtool diff A B``: is one quant really better than another on this text, or is the
difference noise?

A and B are two compare runs (``--per-token`` HDF5 files or ``--state`` files) against one base
file over the same chunks. Every statistic is a ratio of per-chunk sums, so a paired block
bootstrap resamples chunks once and applies the same resample to both runs: what A and B share
(a hard chunk is hard for both) cancels in A − B, and the interval is that of the difference
itself. The draws are ``numpy.random.default_rng(seed).integers(0, n_chunks, (resamples,
n_chunks))``, one row per resample, and the interval is numpy's default percentile of the
2.5th and 97.5th, so anyone can recompute it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError
from kldtool.stats.accumulator import COUNT, N_SAME, SUMS, KldAccumulator
from kldtool.stats.bootstrap import Bootstrap
from kldtool.textio import write_json

# Rows of picks turned into weights at once: bounds the (rows, chunks) matrix.
ROWS = 256


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    better: str  # "lower", "higher" or "nearer 0"


MEASURES = (Measure("kld_mean", "mean KLD", "lower"), Measure("ln_ppl_ratio", "ln PPL ratio", "nearer 0"),
            Measure("same_top_p", "same top p", "higher"), Measure("rms_dp", "RMS Δp", "lower"))


def statistics(v: np.ndarray) -> dict[str, np.ndarray]:
    """Each measure from summed chunk vectors (one row per chunk, resample or run)."""
    n = v[..., COUNT]
    col = {k: v[..., i] for i, k in enumerate(SUMS)}
    return {"kld_mean": col["kld"] / n, "ln_ppl_ratio": (col["nll"] - col["base"]) / n,
            "same_top_p": v[..., N_SAME] / n, "rms_dp": np.sqrt(col["dp2"] / n)}


def _wins(a: np.ndarray, b: np.ndarray, better: str) -> int:
    if better == "lower":
        return int(np.sum(a < b))
    if better == "higher":
        return int(np.sum(a > b))
    return int(np.sum(np.abs(a) < np.abs(b)))


def load_run(path: str) -> tuple[dict, KldAccumulator]:
    """A finished compare run's metadata and per-chunk sums, from either kind of file."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == b"\x89HDF\r\n\x1a\n":
        from kldtool.report.per_token import accumulate, read_per_token

        run, cols = read_per_token(path)
        return run, accumulate([cols], path)
    if magic[:4] == b"PK\x03\x04":
        from kldtool.pipeline.state import load_state

        state = load_state(path)
        if not state.complete:
            a, b = state.chunk_range
            raise UsageError(f"{path}: unfinished compare state (chunks {a}:{state.next_chunk} of {a}:{b}); "
                             f"finish it with `compare --resume --state {path}`")
        return state.meta, state.acc
    raise UsageError(f"{path}: not a compare --per-token HDF5 file or a compare --state file")


def _labels(paths: list[str], metas: list[dict]) -> list[str]:
    names = [os.path.basename(str(m.get("model", {}).get("model", "")).rstrip("/")) for m in metas]
    if len(set(names)) < 2 or not all(names):
        names = [os.path.basename(p) for p in paths]
    return names if names[0] != names[1] else ["A", "B"]


def _sentence(m: Measure, labels: list[str], row: dict) -> str:
    a, b = labels
    lo, hi = row["interval_95"]
    d = row["difference"]
    wins = f"{a} is {m.better} in {row['a_wins']} of {row['chunks']} chunks, {b} in {row['b_wins']}"
    if not row["significant"]:
        return (f"{m.label}: no significant difference: {a} − {b} = {d:+.6g} [{lo:+.6g}, {hi:+.6g}], 95 %; {wins}")
    side = "higher" if d > 0 else "lower"
    return (f"{m.label}: {a}'s is {side} than {b}'s by {abs(d):.6g} [{min(abs(lo), abs(hi)):.6g}, "
            f"{max(abs(lo), abs(hi)):.6g}], 95 %; {wins}")


def paired_bootstrap(va: np.ndarray, vb: np.ndarray, spec: Bootstrap) -> dict[str, np.ndarray]:
    """Per measure, A − B in every resample (the same chunks drawn for both)."""
    n = len(va)
    picks = np.random.default_rng(spec.seed).integers(0, n, size=(spec.resamples, n))
    out: dict[str, list[np.ndarray]] = {m.key: [] for m in MEASURES}
    for r0 in range(0, spec.resamples, ROWS):
        rows = picks[r0:r0 + ROWS]
        weights = np.zeros((len(rows), n))
        np.add.at(weights, (np.arange(len(rows))[:, None], rows), 1.0)
        sa, sb = statistics(weights @ va), statistics(weights @ vb)
        for k in out:
            out[k].append(sa[k] - sb[k])
    return {k: np.concatenate(v) for k, v in out.items()}


def run_diff(path_a: str, path_b: str, bootstrap: Bootstrap, json_path: str | None = None) -> dict:
    (meta_a, acc_a), (meta_b, acc_b) = load_run(path_a), load_run(path_b)
    if meta_a.get("base") != meta_b.get("base"):
        raise UsageError(f"{path_b}: compared against another base file than {path_a} (header or tokens "
                         f"differ); diff pairs the chunks of one base file")
    if acc_a.chunks != acc_b.chunks:
        def span(acc):
            return f"{len(acc.chunks)} chunks from {acc.chunks[0] + 1}" if acc.chunks else "no chunks"
        raise UsageError(f"{path_b} covers other chunks than {path_a} ({span(acc_b)} vs {span(acc_a)}); "
                         f"diff needs both runs over the same chunks")
    if len(acc_a.chunks) < 2:
        raise UsageError(f"{path_a}: {len(acc_a.chunks)} chunk; a paired bootstrap needs at least 2")
    if bootstrap.resamples < 1:
        raise UsageError(f"--bootstrap {bootstrap.resamples}: diff needs resamples (e.g. 1000)")
    labels = _labels([path_a, path_b], [meta_a, meta_b])
    va, vb = np.asarray(acc_a.chunk_vectors), np.asarray(acc_b.chunk_vectors)
    whole_a, whole_b = statistics(va.sum(axis=0)), statistics(vb.sum(axis=0))
    per_a, per_b = statistics(va), statistics(vb)
    draws = paired_bootstrap(va, vb, bootstrap)
    rows, lines = {}, []
    for m in MEASURES:
        lo, hi = np.percentile(draws[m.key], [2.5, 97.5])
        a, b = float(whole_a[m.key]), float(whole_b[m.key])
        row = {"a": a, "b": b, "difference": a - b, "interval_95": [float(lo), float(hi)],
               "standard_error": float(np.std(draws[m.key], ddof=1)), "significant": bool(lo > 0 or hi < 0),
               "better": m.better, "chunks": len(va), "a_wins": _wins(per_a[m.key], per_b[m.key], m.better),
               "b_wins": _wins(per_b[m.key], per_a[m.key], m.better)}
        rows[m.key] = row
        lines.append(_sentence(m, labels, row))
    _print(labels, rows, lines)
    result = {"kind": "kldtool-diff", "a": {"path": path_a, "label": labels[0], "model": meta_a.get("model")},
              "b": {"path": path_b, "label": labels[1], "model": meta_b.get("model")},
              "base": meta_a.get("base"), "protocol": meta_a.get("protocol"), "scored_tokens": acc_a.count,
              "bootstrap": {"method": "paired chunk block bootstrap", "resamples": bootstrap.resamples,
                            "seed": bootstrap.seed},
              "measures": rows, "summary": lines}
    if json_path:
        write_json(json_path, result)
    return result


def _print(labels: list[str], rows: dict, lines: list[str]) -> None:
    a, b = labels
    width = max(12, len(a), len(b))
    print(f"{'':14} {a:>{width}} {b:>{width}} {'A − B':>12}  {'95 % interval':>27}  sig  A wins")
    for m in MEASURES:
        r = rows[m.key]
        lo, hi = r["interval_95"]
        print(f"{m.label:14} {r['a']:>{width}.6g} {r['b']:>{width}.6g} {r['difference']:>+12.6g}  "
              f"[{lo:>+12.6g}, {hi:>+12.6g}]  {'yes' if r['significant'] else ' no'}  {r['a_wins']}/{r['chunks']}")
    print()
    for line in lines:
        print(line)
