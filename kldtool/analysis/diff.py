"""``kldtool diff A B`` (report/diff.py prints it): is one quant really better than another on this text, or is the
difference noise? A and B are two compare runs (``--per-token`` HDF5 files or ``--state``
files) against one base file over the same chunks, compared by a paired block bootstrap
(``stats/paired.py``).
"""

from __future__ import annotations

import os

import numpy as np

from kldtool.errors import UsageError
from kldtool.engines.registry import bounded_engines
from kldtool.provenance.manifest import check_manifests
from kldtool.stats.accumulator import KldAccumulator
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.paired import MEASURES, compare_runs, sentence


def load_run(path: str) -> tuple[dict, KldAccumulator]:
    """A finished compare run's metadata and per-chunk sums, from either kind of file."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == b"\x89HDF\r\n\x1a\n":
        from kldtool.analysis.per_token import accumulate, read_per_token

        run, cols = read_per_token(path)
        return run, accumulate([cols], path)
    if magic[:4] == b"PK\x03\x04":
        from kldtool.analysis.state_file import load_state

        state = load_state(path)
        if not state.complete:
            a, b = state.chunk_range
            raise UsageError(
                f"{path}: unfinished compare state ({state.progress()} of {a}:{b}); "
                f"finish it with `compare --resume --state {path}`"
            )
        return state.meta, state.acc.in_window_order()
    raise UsageError(f"{path}: not a compare --per-token HDF5 file or a compare --state file")


def _labels(paths: list[str], metas: list[dict]) -> list[str]:
    names = [os.path.basename(str(m.get("model", {}).get("model", "")).rstrip("/")) for m in metas]
    if len(set(names)) < 2 or not all(names):
        names = [os.path.basename(p) for p in paths]
    return names if names[0] != names[1] else ["A", "B"]


def run_diff(path_a: str, path_b: str, bootstrap: Bootstrap, mix: bool = False) -> dict:
    """Both runs' paired measures (report/diff.py prints them), as ``diff --json`` writes them;
    two audits of served models (compare --generated) paired by prompt (analysis/served_runs.py)."""
    from kldtool.analysis.served_runs import is_audit, paired, read_audits

    if is_audit(path_a) or is_audit(path_b):
        return paired(*read_audits([path_a, path_b]), bootstrap)
    (meta_a, acc_a), (meta_b, acc_b) = load_run(path_a), load_run(path_b)
    if not mix:
        check_manifests([(path_a, meta_a.get("manifest")), (path_b, meta_b.get("manifest"))], bounded=bounded_engines())
    if meta_a.get("base") != meta_b.get("base"):
        raise UsageError(
            f"{path_b}: compared against another base file than {path_a} (header or tokens "
            f"differ); diff pairs the chunks of one base file"
        )
    if acc_a.chunks != acc_b.chunks:

        def span(acc):
            return f"{len(acc.chunks)} chunks from {acc.chunks[0] + 1}" if acc.chunks else "no chunks"

        raise UsageError(
            f"{path_b} covers other chunks than {path_a} ({span(acc_b)} vs {span(acc_a)}); "
            f"diff needs both runs over the same chunks"
        )
    if len(acc_a.chunks) < 2:
        raise UsageError(f"{path_a}: {len(acc_a.chunks)} chunk; a paired bootstrap needs at least 2")
    if bootstrap.resamples < 1:
        raise UsageError(f"--bootstrap {bootstrap.resamples}: diff needs resamples (e.g. 1000)")
    labels = _labels([path_a, path_b], [meta_a, meta_b])
    rows = compare_runs(np.asarray(acc_a.chunk_vectors), np.asarray(acc_b.chunk_vectors), bootstrap)
    lines = [sentence(m, labels, rows[m.key]) for m in MEASURES]
    result = {
        "kind": "kldtool-diff",
        "a": {"path": path_a, "label": labels[0], "model": meta_a.get("model"), "manifest": meta_a.get("manifest")},
        "b": {"path": path_b, "label": labels[1], "model": meta_b.get("model"), "manifest": meta_b.get("manifest")},
        "base": meta_a.get("base"),
        "protocol": meta_a.get("protocol"),
        "scored_tokens": acc_a.count,
        "bootstrap": {
            "method": "paired chunk block bootstrap",
            "resamples": bootstrap.resamples,
            "seed": bootstrap.seed,
        },
        "measures": rows,
        "summary": lines,
    }
    return result
