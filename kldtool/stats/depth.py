"""KLD by depth: a run's scored tokens split by the predicted token's position in its window.

Every chunk's tokens are summed per depth bucket as they are scored (``depth_block``), beside
the chunk's whole sums, so the table needs no per-token file, survives a checkpoint and merges
as the run's sums do. A bucket's interval is the run's chunk block bootstrap over the chunks
that have tokens in it. The buckets partition the scored tokens: their counts and KLD sums add
up to the run's.
"""

from __future__ import annotations

import numpy as np

from kldtool.errors import UsageError
from kldtool.stats.accumulator import COUNT, N_SAME, SUM_OF, SUMS, VECTOR_LEN
from kldtool.stats.bootstrap import Bootstrap, block_bootstrap, chunk_statistics

# The run's sums a bucket keeps (its mean KLD, PPL ratio, RMS Δp), then its same-top count and tokens.
DEPTH_SUMS = ("nll", "base", "kld", "kld2", "dp", "dp2")
DEPTH_LEN = len(DEPTH_SUMS) + 2
# Where the scored depths span fewer log2 buckets than this (llama.cpp's scored half of each
# window), the default splits them into LINEAR equal buckets instead.
MIN_LOG2_BUCKETS = 4
LINEAR = 8


def default_bounds(lo: int, hi: int) -> list[int]:
    """Bucket bounds over the scored depths lo..hi: log2 buckets (1, 2-3, 4-7, ...), or LINEAR
    equal ones where the depths span fewer than MIN_LOG2_BUCKETS of those."""
    starts, d = [], 1
    while d <= hi:
        if d * 2 > lo:  # the first such power of two is at most lo
            starts.append(d)
        d *= 2
    if len(starts) < MIN_LOG2_BUCKETS and hi - lo + 1 >= LINEAR:
        starts = list(range(lo, hi + 1, -(-(hi - lo + 1) // LINEAR)))
    return [*starts, hi + 1]


def parse_depth_bins(spec: str | None, lo: int, hi: int) -> list[int]:
    """``--depth-bins``: ``log2`` (or nothing: the default) or bucket starts ``E1,E2,...``
    (strictly increasing, at least 1; a bucket from depth 1 is added where E1 > 1, starts past
    the deepest scored position are dropped). Returns the bounds: the starts, then hi + 1."""
    if spec is None or spec.strip().lower() in ("", "log2"):
        return default_bounds(lo, hi)
    try:
        starts = [int(x) for x in spec.split(",")]
    except ValueError:
        raise UsageError(f"--depth-bins {spec}: expected log2 or bucket starts like 1,1024,32768") from None
    if any(e < 1 for e in starts) or any(b <= a for a, b in zip(starts, starts[1:])):
        raise UsageError(f"--depth-bins {spec}: bucket starts must be at least 1 and strictly increasing")
    starts = [e for e in starts if e <= hi]
    return [*([1] if not starts or starts[0] > 1 else []), *starts, hi + 1]


def labels(bounds) -> list[str]:
    """``a-b`` of each bucket (``a`` alone for one depth)."""
    return [f"{a}-{b - 1}" if b - 1 > a else str(a) for a, b in zip(bounds, bounds[1:])]


def window_depths(first: int, n_scored: int) -> np.ndarray:
    """The depth of each scored position's predicted token: its index in the window."""
    return first + 1 + np.arange(n_scored, dtype=np.int64)


def depth_block(records, depths: np.ndarray, bounds) -> np.ndarray:
    """(buckets, DEPTH_LEN) sums of one chunk's records, each bucket by the run's own formulas."""
    from kldtool.reduce.records import FIELDS, TokenRecords

    depths = np.asarray(depths, np.int64)
    if len(depths) != len(records) or (len(depths) and (depths.min() < bounds[0] or depths.max() >= bounds[-1])):
        raise ValueError(f"{len(depths)} depths in {bounds[0]}..{bounds[-1] - 1} for {len(records)} records")
    which = np.searchsorted(np.asarray(bounds), depths, side="right") - 1
    block = np.zeros((len(bounds) - 1, DEPTH_LEN), np.float64)
    for b in np.unique(which):
        mask = which == b
        part = TokenRecords(**{f: getattr(records, f)[mask] for f in FIELDS})
        block[b, : len(DEPTH_SUMS)] = [SUM_OF[name](part) for name in DEPTH_SUMS]
        block[b, -2:] = np.count_nonzero(part.same_top), len(part)
    return block


def as_run_vectors(blocks: np.ndarray) -> np.ndarray:
    """Depth blocks (..., DEPTH_LEN) as run-shaped chunk vectors (..., VECTOR_LEN), the other sums 0,
    for the run's statistics and bootstrap."""
    out = np.zeros((*blocks.shape[:-1], VECTOR_LEN), np.float64)
    for i, name in enumerate(DEPTH_SUMS):
        out[..., SUMS.index(name)] = blocks[..., i]
    out[..., N_SAME], out[..., COUNT] = blocks[..., -2], blocks[..., -1]
    return out


def depth_table(bounds, blocks: list[np.ndarray], spec: Bootstrap) -> dict:
    """Each bucket's tokens, share, KLD sum, mean KLD (with its 95 % chunk block-bootstrap
    interval), ln PPL ratio, same top p and RMS Δp; buckets no token falls in are left out."""
    vectors = as_run_vectors(np.asarray(blocks, np.float64).reshape(-1, len(bounds) - 1, DEPTH_LEN))
    total = int(vectors[..., COUNT].sum())
    rows = []
    for b, label in enumerate(labels(bounds)):
        per_chunk = vectors[:, b]
        per_chunk = per_chunk[per_chunk[:, COUNT] > 0]
        if not len(per_chunk):
            continue
        whole = per_chunk.sum(axis=0)
        stats = chunk_statistics(whole)
        row = {
            "bucket": label,
            "depths": [int(bounds[b]), int(bounds[b + 1]) - 1],
            "tokens": int(whole[COUNT]),
            "share": float(whole[COUNT]) / total,
            "windows": len(per_chunk),
            "kld_sum": float(whole[SUMS.index("kld")]),
            **{k: float(v) for k, v in stats.items()},
        }
        boot = block_bootstrap(list(per_chunk), spec)
        if boot:
            row["kld_mean_interval_95"] = boot["kld_mean"]["interval_95"]
        rows.append(row)
    return {"bounds": [int(e) for e in bounds], "tokens": total, "rows": rows}
