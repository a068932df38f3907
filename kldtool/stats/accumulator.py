"""Running sums as llama-perplexity keeps them (docs/llama-perplexity-format.md §5) and of the extra metrics, plus
the per-token values the percentiles and top-1 buckets need.

The sums are kept per chunk as well as in total. That costs 25 floats a chunk and makes a
run's state exact to save and restore (``--resume``) and exact to merge (``kldtool merge``):
replaying the chunk sums in chunk order repeats the very additions the uninterrupted run
made, so every printed digit, including each chunk's running line, comes out the same. The
per-chunk sums are also the blocks of the bootstrap (``stats/bootstrap.py``).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from kldtool.reduce import TokenRecords
from kldtool.reduce.statistics import STATISTICS


# Each chunk's sums, by name, from its records (reduce/statistics.py declares them with their
# statistic): the one list the chunk vectors, the state files, the bootstrap and the statistics read.
SUM_OF = {name: f for s in STATISTICS for name, f in s.sums.items()}
SUMS = tuple(SUM_OF)
N_SAME, COUNT = len(SUMS), len(SUMS) + 1
VECTOR_LEN = len(SUMS) + 2
# Per-token values kept for percentiles and top-1 buckets, float32 each.
VALUES = ("kld", "dp", "ptop_base", "tv", "p_out")


def in_vector_order(vectors, columns: list[str]) -> np.ndarray:
    """Chunk vectors written with the columns ``columns`` (sum names, "n_same", "count", in any
    order) in this kldtool's layout (``SUMS``, then n_same and count), each column taken by its
    name; a ValueError where the shape, a repeated name or a missing one says they do not fit."""
    vectors = np.asarray(vectors, np.float64)
    if vectors.ndim != 2 or vectors.shape[1] != len(columns) or len(set(columns)) != len(columns):
        raise ValueError(f"chunk vectors of shape {vectors.shape} for {len(columns)} named columns")
    return vectors[:, [columns.index(c) for c in (*SUMS, "n_same", "count")]]


def _spans(counts) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk's per-token values, from the chunks' token counts."""
    ends = np.cumsum(np.asarray(counts, np.int64))
    return zip((ends - counts).tolist(), ends.tolist())


def chunk_vector(r: TokenRecords) -> np.ndarray:
    """One chunk's contribution: the sums, the same-top count and the token count."""
    sums = [f(r) for f in SUM_OF.values()]
    return np.array([*sums, float(np.count_nonzero(r.same_top)), float(len(r))], dtype=np.float64)


def chunk_values(r: TokenRecords) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(r, name), np.float32) for name in VALUES}


class KldAccumulator:
    """The run's sums per chunk and in total, its per-token values and, where ``depth_bounds``
    are given, each chunk's sums per depth bucket (``stats/depth.py``)."""

    def __init__(self, depth_bounds=None):
        self.total = np.zeros(VECTOR_LEN, np.float64)
        self.chunks: list[int] = []
        self.chunk_vectors: list[np.ndarray] = []
        self._values: dict[str, list[np.ndarray]] = {name: [] for name in VALUES}
        self.depth_bounds = None if depth_bounds is None else tuple(int(b) for b in depth_bounds)
        self.depth_blocks: list[np.ndarray] = []

    @property
    def sums(self) -> dict[str, float]:
        return {k: float(v) for k, v in zip(SUMS, self.total)}

    @property
    def n_same(self) -> int:
        return int(self.total[N_SAME])

    @property
    def count(self) -> int:
        return int(self.total[COUNT])

    def add(self, r: TokenRecords, chunk: int = -1, depth: np.ndarray | None = None) -> None:
        """One chunk's records; ``depth``: their sums per depth bucket (``stats/depth.py``'s
        ``depth_block``), needed where the accumulator keeps depth buckets."""
        self.add_chunk(chunk, chunk_vector(r), chunk_values(r), depth)

    def add_chunk(self, chunk: int, vector: np.ndarray, values: dict[str, np.ndarray], depth=None) -> None:
        n = int(vector[COUNT])
        if any(len(values[name]) != n for name in VALUES):
            raise ValueError(f"chunk {chunk}: {[len(values[k]) for k in VALUES]} values for {n} tokens")
        if self.depth_bounds is not None:
            if depth is None or np.shape(depth)[0] != len(self.depth_bounds) - 1:
                raise ValueError(f"chunk {chunk}: depth sums of shape {np.shape(depth)} for {self.depth_bounds}")
            self.depth_blocks.append(np.asarray(depth, np.float64))
        self.total += vector
        self.chunks.append(int(chunk))
        self.chunk_vectors.append(np.asarray(vector, np.float64))
        for name in VALUES:
            self._values[name].append(values[name])

    def merge(self, other: "KldAccumulator") -> None:
        """Add ``other``'s chunks. Their depth buckets are kept where both have the same bounds
        (an empty accumulator takes ``other``'s); otherwise the merged sums have none."""
        if not self.chunks:
            self.depth_bounds = other.depth_bounds
        elif self.depth_bounds != other.depth_bounds:
            self.depth_bounds, self.depth_blocks = None, []
        for chunk, vector, values, depth in other.iter_chunks():
            self.add_chunk(chunk, vector, values, depth)

    def in_window_order(self) -> "KldAccumulator":
        """The same chunks added in window order (itself when they already are): a run that
        visited its windows in a random order then ends with the very totals a run in the file's
        order has, and so does a merge of such runs."""
        if self.chunks == sorted(self.chunks):
            return self
        acc = KldAccumulator(self.depth_bounds)
        for chunk, vector, values, depth in sorted(self.iter_chunks(), key=lambda c: c[0]):
            acc.add_chunk(chunk, vector, values, depth)
        return acc

    def truncate(self, n_chunks: int) -> None:
        """Keep only the first ``n_chunks`` chunks. The total is rebuilt by the same additions
        in the same order, so it equals the total the run had after those chunks."""
        n_tokens = int(sum(int(v[COUNT]) for v in self.chunk_vectors[:n_chunks]))
        self._values = {name: [self.per_token(name)[:n_tokens]] for name in VALUES}
        del self.chunks[n_chunks:], self.chunk_vectors[n_chunks:], self.depth_blocks[n_chunks:]
        self.total = np.zeros(VECTOR_LEN, np.float64)
        for v in self.chunk_vectors:
            self.total += v

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray], np.ndarray | None]]:
        """(chunk, vector, per-token values, depth sums or None) in the order they were added."""
        whole = {name: self.per_token(name) for name in VALUES}
        counts = np.array([int(v[COUNT]) for v in self.chunk_vectors], np.int64)
        depths = self.depth_blocks if self.depth_bounds is not None else [None] * len(self.chunks)
        for chunk, vector, (a, b), depth in zip(self.chunks, self.chunk_vectors, _spans(counts), depths):
            yield chunk, vector, {name: v[a:b] for name, v in whole.items()}, depth

    def per_token(self, name: str) -> np.ndarray:
        """One of ``VALUES`` for every token, in scoring order."""
        parts = self._values[name]
        if len(parts) != 1:
            parts[:] = [np.concatenate(parts) if parts else np.zeros(0, np.float32)]
        return parts[0]

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """All per-token (kld, dp) float32 values in scoring order."""
        return self.per_token("kld"), self.per_token("dp")

    def chunk_table(self) -> dict:
        """The per-chunk sums as JSON (a result's ``chunk_sums``): what ``report`` pairs runs by."""
        return {
            "columns": [*SUMS, "n_same", "count"],
            "chunks": list(self.chunks),
            "vectors": np.asarray(self.chunk_vectors, np.float64).reshape(-1, VECTOR_LEN).tolist(),
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to rebuild this accumulator exactly (see :meth:`from_arrays`)."""
        vectors = np.array(self.chunk_vectors, np.float64).reshape(-1, VECTOR_LEN)
        out = {
            "chunks": np.array(self.chunks, np.int64),
            "chunk_vectors": vectors,
            **{name: self.per_token(name) for name in VALUES},
        }
        if self.depth_bounds is not None:
            out["depth_bounds"] = np.array(self.depth_bounds, np.int64)
            out["depth_sums"] = np.array(self.depth_blocks, np.float64).reshape(len(self.chunks), -1)
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "KldAccumulator":
        chunks, vectors = np.asarray(a["chunks"]), np.asarray(a["chunk_vectors"], np.float64)
        values = {name: np.asarray(a[name], np.float32) for name in VALUES}
        if vectors.ndim != 2 or vectors.shape != (len(chunks), VECTOR_LEN):
            raise ValueError(f"chunk vectors of shape {vectors.shape} for {len(chunks)} chunks")
        counts = vectors[:, COUNT].astype(np.int64)
        if (counts < 0).any() or any(int(counts.sum()) != len(v) for v in values.values()):
            raise ValueError(f"{len(values['kld'])} per-token values for {int(counts.sum())} tokens")
        acc = cls(a["depth_bounds"].tolist() if "depth_bounds" in a else None)
        depths = [None] * len(chunks)
        if acc.depth_bounds is not None:  # a state file of an older kldtool has none
            depths = np.asarray(a["depth_sums"], np.float64).reshape(len(chunks), len(acc.depth_bounds) - 1, -1)
        for chunk, vector, (a_, b_), depth in zip(chunks, vectors, _spans(counts), depths):
            acc.add_chunk(int(chunk), vector, {name: v[a_:b_] for name, v in values.items()}, depth)
        return acc


class PplAccumulator:
    """Phase-1 perplexity: sums of the float32 per-token NLL in float64."""

    def __init__(self):
        self.nll = 0.0
        self.nll2 = 0.0
        self.count = 0

    def add(self, nll: np.ndarray) -> None:
        v = nll.astype(np.float64)
        self.nll += float(v.sum())
        self.nll2 += float((v * v).sum())
        self.count += len(v)

    @property
    def ppl(self) -> float:
        return float(np.exp(self.nll / self.count))

    def estimate(self) -> tuple[float, float]:
        """(PPL, uncertainty) as llama-perplexity's ``Final estimate`` line."""
        m = self.nll / self.count
        v = self.nll2 / self.count - m * m
        ppl = float(np.exp(m))
        return ppl, (ppl * float(np.sqrt(v / (self.count - 1))) if v > 0 and self.count > 1 else float("nan"))
