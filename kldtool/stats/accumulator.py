"""Running sums as llama-perplexity keeps them (FORMAT.md §5), plus the per-token values
the percentiles need.

The sums are kept per chunk as well as in total. That costs 12 floats a chunk and makes a
run's state exact to save and restore (``--resume``) and exact to merge (``kldtool merge``):
replaying the chunk sums in chunk order repeats the very additions the uninterrupted run
made, so every printed digit, including each chunk's running line, comes out the same.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from kldtool.reduce import TokenRecords

_SUMS = ("nll", "nll2", "base", "base2", "nll_base", "kld", "kld2", "dp", "dp2", "dp4")
N_SAME, COUNT = len(_SUMS), len(_SUMS) + 1
VECTOR_LEN = len(_SUMS) + 2


def _fsum(x: np.ndarray) -> float:
    return float(np.sum(x, dtype=np.float64))


def _spans(counts) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk's per-token values, from the chunks' token counts."""
    ends = np.cumsum(np.asarray(counts, np.int64))
    return zip((ends - counts).tolist(), ends.tolist())


def chunk_vector(r: TokenRecords) -> np.ndarray:
    """One chunk's contribution: the ten sums, the same-top count and the token count."""
    nll = r.nll.astype(np.float32)
    nb = r.nll_base.astype(np.float32)
    dp = r.dp.astype(np.float32)
    # The squares and the cross product are float32 products, as in llama.cpp.
    dp2 = (dp * dp).astype(np.float64)
    return np.array([
        _fsum(nll), _fsum(nll * nll), _fsum(nb), _fsum(nb * nb), _fsum(nll * nb),
        _fsum(r.kld), _fsum(r.kld.astype(np.float64) ** 2),
        _fsum(dp), _fsum(dp2), _fsum(dp2 * dp2),
        float(np.count_nonzero(r.same_top)), float(len(r)),
    ], dtype=np.float64)


class KldAccumulator:
    def __init__(self):
        self.total = np.zeros(VECTOR_LEN, np.float64)
        self.chunks: list[int] = []
        self.chunk_vectors: list[np.ndarray] = []
        self._kld: list[np.ndarray] = []
        self._dp: list[np.ndarray] = []

    @property
    def sums(self) -> dict[str, float]:
        return {k: float(v) for k, v in zip(_SUMS, self.total)}

    @property
    def n_same(self) -> int:
        return int(self.total[N_SAME])

    @property
    def count(self) -> int:
        return int(self.total[COUNT])

    def add(self, r: TokenRecords, chunk: int = -1) -> None:
        self.add_chunk(chunk, chunk_vector(r), r.kld.astype(np.float32), r.dp.astype(np.float32))

    def add_chunk(self, chunk: int, vector: np.ndarray, kld: np.ndarray, dp: np.ndarray) -> None:
        if len(kld) != int(vector[COUNT]) or len(dp) != len(kld):
            raise ValueError(f"chunk {chunk}: {len(kld)} values for {int(vector[COUNT])} tokens")
        self.total += vector
        self.chunks.append(int(chunk))
        self.chunk_vectors.append(np.asarray(vector, np.float64))
        self._kld.append(kld)
        self._dp.append(dp)

    def merge(self, other: "KldAccumulator") -> None:
        for chunk, vector, kld, dp in other.iter_chunks():
            self.add_chunk(chunk, vector, kld, dp)

    def truncate(self, n_chunks: int) -> None:
        """Keep only the first ``n_chunks`` chunks. The total is rebuilt by the same additions
        in the same order, so it equals the total the run had after those chunks."""
        kld, dp = self.values()
        n_tokens = int(sum(int(v[COUNT]) for v in self.chunk_vectors[:n_chunks]))
        del self.chunks[n_chunks:], self.chunk_vectors[n_chunks:]
        self._kld, self._dp = [kld[:n_tokens]], [dp[:n_tokens]]
        self.total = np.zeros(VECTOR_LEN, np.float64)
        for v in self.chunk_vectors:
            self.total += v

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(chunk, vector, kld values, dp values) in the order they were added."""
        kld, dp = self.values()
        counts = np.array([int(v[COUNT]) for v in self.chunk_vectors], np.int64)
        for chunk, vector, (a, b) in zip(self.chunks, self.chunk_vectors, _spans(counts)):
            yield chunk, vector, kld[a:b], dp[a:b]

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """All per-token (kld, dp) float32 values in scoring order."""
        if not self._kld:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        self._kld = [np.concatenate(self._kld)]
        self._dp = [np.concatenate(self._dp)]
        return self._kld[0], self._dp[0]

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to rebuild this accumulator exactly (see :meth:`from_arrays`)."""
        kld, dp = self.values()
        vectors = np.array(self.chunk_vectors, np.float64).reshape(-1, VECTOR_LEN)
        return {"chunks": np.array(self.chunks, np.int64), "chunk_vectors": vectors, "kld": kld, "dp": dp}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> "KldAccumulator":
        chunks, vectors = np.asarray(a["chunks"]), np.asarray(a["chunk_vectors"], np.float64)
        kld, dp = np.asarray(a["kld"], np.float32), np.asarray(a["dp"], np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(chunks), VECTOR_LEN):
            raise ValueError(f"chunk vectors of shape {vectors.shape} for {len(chunks)} chunks")
        counts = vectors[:, COUNT].astype(np.int64)
        if (counts < 0).any() or int(counts.sum()) != len(kld) or len(dp) != len(kld):
            raise ValueError(f"{len(kld)} per-token values for {int(counts.sum())} tokens")
        acc = cls()
        for chunk, vector, (a_, b_) in zip(chunks, vectors, _spans(counts)):
            acc.add_chunk(int(chunk), vector, kld[a_:b_], dp[a_:b_])
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
