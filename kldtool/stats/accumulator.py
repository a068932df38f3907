"""Running sums as llama-perplexity keeps them (FORMAT.md §5), plus the per-token values
the percentiles need. Accumulators merge exactly, so shards can be combined."""

from __future__ import annotations

import numpy as np

from kldtool.reduce import TokenRecords

_SUMS = ("nll", "nll2", "base", "base2", "nll_base", "kld", "kld2", "dp", "dp2", "dp4")


def _fsum(x: np.ndarray) -> float:
    return float(np.sum(x, dtype=np.float64))


class KldAccumulator:
    def __init__(self):
        self.sums = dict.fromkeys(_SUMS, 0.0)
        self.n_same = 0
        self.count = 0
        self._kld: list[np.ndarray] = []
        self._dp: list[np.ndarray] = []

    def add(self, r: TokenRecords) -> None:
        nll = r.nll.astype(np.float32)
        nb = r.nll_base.astype(np.float32)
        dp = r.dp.astype(np.float32)
        # The squares and the cross product are float32 products, as in llama.cpp.
        dp2 = (dp * dp).astype(np.float64)
        s = self.sums
        s["nll"] += _fsum(nll)
        s["nll2"] += _fsum(nll * nll)
        s["base"] += _fsum(nb)
        s["base2"] += _fsum(nb * nb)
        s["nll_base"] += _fsum(nll * nb)
        s["kld"] += _fsum(r.kld)
        s["kld2"] += _fsum(r.kld.astype(np.float64) ** 2)
        s["dp"] += _fsum(dp)
        s["dp2"] += _fsum(dp2)
        s["dp4"] += _fsum(dp2 * dp2)
        self.n_same += int(np.count_nonzero(r.same_top))
        self.count += len(r)
        self._kld.append(r.kld.astype(np.float32))
        self._dp.append(dp)

    def merge(self, other: "KldAccumulator") -> None:
        for k in _SUMS:
            self.sums[k] += other.sums[k]
        self.n_same += other.n_same
        self.count += other.count
        self._kld.extend(other._kld)
        self._dp.extend(other._dp)

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """All per-token (kld, dp) float32 values in scoring order."""
        if not self._kld:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        self._kld = [np.concatenate(self._kld)]
        self._dp = [np.concatenate(self._dp)]
        return self._kld[0], self._dp[0]


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
