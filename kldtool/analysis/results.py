"""Load the results of many compare runs for ``kldtool report``: JSON results (compare or
merge ``--json``) and per-token HDF5 files (``compare --per-token``), one row per model.

Per-token files of the same model are pooled: their tokens go into one accumulator, so the
percentiles are those of all tokens together, not an average of each run's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError
from kldtool.provenance.identity import model_identity
from kldtool.engines.registry import bounded_engines
from kldtool.provenance.manifest import check_manifests
from kldtool.analysis.per_token import accumulate, read_per_token
from kldtool.provenance.sizes import model_size_dict
from kldtool.stats.accumulator import SUMS, in_vector_order
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.run_stats import statistics
from kldtool.stats.summary import MIN_TOKENS_FOR_STATS
from kldtool.runtime.small_files import read_json


@dataclass(kw_only=True)
class ResultRow:
    label: str
    sources: list[str]
    model: dict
    base: dict | None
    protocol: dict | None
    statistics: dict
    size: dict | None = None
    chunks: list[int] | None = None  # the chunks the run scored, with their sums (pairing runs)
    vectors: np.ndarray | None = None
    manifest: dict | None = None
    run: dict | None = None  # the whole JSON result (report --card reads its receipts)

    @property
    def bpw(self) -> float | None:
        return self.size["bpw_linear"] if self.size else None


def _label(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".json", ".h5", ".hdf5"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def _size(run: dict) -> dict | None:
    """The size the run recorded; for results written before compare recorded one, measured now."""
    return run.get("model_size") or model_size_dict((run.get("model") or {}).get("model"))


def _from_json(path: str) -> ResultRow:
    run = read_json(path, path)
    if not isinstance(run, dict) or run.get("command") not in ("compare", "merge") or "statistics" not in run:
        raise UsageError(f"{path}: not a kldtool compare or merge result (--json)")
    if "kld_mean" not in run["statistics"]:
        raise UsageError(f"{path}: the run scored too few tokens for statistics")
    chunks, vectors = _chunk_sums(run.get("chunk_sums"), path)
    return ResultRow(
        label=_label(path),
        sources=[path],
        model=run.get("model") or {},
        base=run.get("base"),
        protocol=run.get("protocol"),
        statistics=run["statistics"],
        size=_size(run),
        chunks=chunks,
        vectors=vectors,
        manifest=run.get("manifest"),
        run=run,
    )


def _chunk_sums(table, path: str) -> tuple[list[int] | None, np.ndarray | None]:
    """A result's per-chunk sums; (None, None) for results written before they were kept."""
    if table is None:
        return None, None
    try:
        columns = list(table["columns"])
        if not set(SUMS) <= set(columns) or len(set(columns)) != len(columns):
            return None, None  # a kldtool without some of these sums: report without pairing
        chunks = [int(c) for c in table["chunks"]]
        vectors = in_vector_order(np.asarray(table["vectors"], np.float64).reshape(len(chunks), len(columns)), columns)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: corrupt chunk_sums ({e})") from None
    return chunks, vectors


def _from_per_token(files: list[tuple[str, dict, dict]]) -> ResultRow:
    """One row from the (path, run, columns) of one model's per-token files."""
    paths, runs, cols = (list(x) for x in zip(*files))
    acc = accumulate(cols, ", ".join(paths))
    if acc.count < MIN_TOKENS_FOR_STATS:
        raise UsageError(f"{paths[0]}: only {acc.count} tokens; at least {MIN_TOKENS_FOR_STATS} are needed")
    stats = statistics(acc, Bootstrap())[1]
    first = runs[0]
    return ResultRow(
        label=_label(paths[0]),
        sources=list(paths),
        model=first.get("model") or {},
        base=first.get("base"),
        protocol=first.get("protocol"),
        statistics=stats,
        size=_size(first),
        chunks=list(acc.chunks),
        vectors=np.asarray(acc.chunk_vectors),
        manifest=first.get("manifest"),
    )


def _group_per_token(paths: list[str]) -> list[list[tuple[str, dict, dict]]]:
    """Each per-token file read once, grouped by model and base file."""
    groups: dict[str, list] = {}
    for p in paths:
        run, cols = read_per_token(p)
        key = json.dumps([model_identity(run.get("model") or {}, False), run.get("base")], sort_keys=True)
        groups.setdefault(key, []).append((p, run, cols))
    return list(groups.values())


def same_protocol(a: dict | None, b: dict | None) -> bool:
    """Equal in every parameter both name: a llama.cpp raw file records only name and n_ctx,
    a kldtool container more, and the two can hold the same scoring."""
    a, b = a or {}, b or {}
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def load_results(paths: list[str], mix: bool = False) -> list[ResultRow]:
    """One row per model, checked to share one base file and protocol (unless ``mix``)."""
    if not paths:
        raise UsageError("report needs result files: compare --json FILE or compare --per-token FILE.h5")
    h5 = [p for p in paths if p.endswith((".h5", ".hdf5"))]
    rows = [_from_json(p) for p in paths if p not in h5]
    rows += [_from_per_token(g) for g in _group_per_token(h5)]
    seen: dict[str, str] = {}
    for r in rows:
        key = json.dumps(model_identity(r.model, False), sort_keys=True)
        if key in seen and not mix:
            raise UsageError(
                f"{r.sources[0]}: a second result for the model of {seen[key]}; "
                f"give one per model (per-token .h5 files of one model are pooled)"
            )
        seen.setdefault(key, r.sources[0])
    if not mix:
        ref = rows[0]
        for r in rows[1:]:
            if r.base != ref.base:
                raise UsageError(
                    f"{r.sources[0]}: compared against another base file than {ref.sources[0]} "
                    f"(header or tokens differ); --mix reports them together anyway"
                )
            if not same_protocol(r.protocol, ref.protocol):
                raise UsageError(
                    f"{r.sources[0]}: protocol {r.protocol} differs from {ref.sources[0]}'s "
                    f"{ref.protocol}; --mix reports them together anyway"
                )
        check_manifests([(r.sources[0], r.manifest) for r in rows], bounded=bounded_engines())
    return sorted(rows, key=lambda r: (r.size is None, (r.size or {}).get("file_bytes", 0), r.label))
