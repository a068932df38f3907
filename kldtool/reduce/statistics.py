"""Every per-token statistic, declared once: its record column and dtype, the chunk sums the
run keeps of it, what a per-token file written before it existed reads as, and what a server's
top-K log-probs give of it. The record class and ``to_records`` (records.py), the accumulator's
sums (stats/accumulator.py), the per-token file's columns and older-file values
(analysis/per_token.py) and an endpoint run's exactness labels (engines/endpoint/engine.py) are
derived from ``STATISTICS``. docs/design.md, "Adding a statistic", lists the rest: the backends
(which name their columns themselves, checked against ``WHOLE_ROW`` at import) and the console.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


def _fsum(x) -> float:
    return float(np.sum(x, dtype=np.float64))


def _f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def _f64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def _dp2(r) -> np.ndarray:
    # The squares and the cross product are float32 products, as in llama.cpp.
    dp = _f32(r.dp)
    return (dp * dp).astype(np.float64)


def _sum_and_square(name: str, square: str) -> dict[str, Callable]:
    """A float64 sum of the column and of its square: a mean with llama.cpp's ±."""
    return {name: lambda r: _fsum(_f64(getattr(r, name))), square: lambda r: _fsum(_f64(getattr(r, name)) ** 2)}


def _sum(name: str) -> dict[str, Callable]:
    return {name: lambda r: _fsum(_f64(getattr(r, name)))}


@dataclass(frozen=True, kw_only=True)
class Statistic:
    """One record column. ``sums``: chunk sum name -> its value from a chunk's records (in the
    order the chunk vectors, state files and results list them). ``older``: the value a per-token
    file written before the column existed reads as (None: every such file has it). ``served``:
    what a server's top-K log-probs give of the statistics named ``labels``: "exact", "lower_bound",
    "interval", or "top" (exact, unless an entry of the top K came back without a sure id: then a
    lower bound); ``min_k``: the K it needs. ``filled``: a reducer of whole rows leaves it out
    (``to_records`` knows it from the other columns). ``mean``: the key in a result's "extra"
    of its mean with llama.cpp's ±, from its first two sums (the values', their squares')."""

    name: str
    dtype: type
    sums: dict[str, Callable] = field(default_factory=dict)
    older: float | int | None = None
    served: str | None = None
    labels: tuple[str, ...] = ()
    min_k: int = 1
    filled: bool = False
    mean: str | None = None


def _divergence(name: str, mean: str) -> Statistic:
    """A divergence known as a lower bound from a server's top K, with its mean and ±."""
    sums = _sum_and_square(name, name + "2")
    return Statistic(name=name, dtype=np.float64, sums=sums, served="lower_bound", labels=(name,), mean=mean)


def _overlap(k: int) -> Statistic:
    """|top-k(q) ∩ top-k(base)|: exact from a server's top K of at least k."""
    name = f"top{k}"
    sums = _sum_and_square(name, name + "_2")
    return Statistic(name=name, dtype=np.uint8, sums=sums, served="top", labels=(name,), min_k=k)


STATISTICS = (
    Statistic(
        name="nll",  # the compared model's NLL of the target
        dtype=np.float32,
        sums={"nll": lambda r: _fsum(_f32(r.nll)), "nll2": lambda r: _fsum(_f32(r.nll) * _f32(r.nll))},
        served="exact",
        labels=("ppl",),
    ),
    Statistic(
        name="nll_base",  # decoded from the base row
        dtype=np.float32,
        sums={
            "base": lambda r: _fsum(_f32(r.nll_base)),
            "base2": lambda r: _fsum(_f32(r.nll_base) * _f32(r.nll_base)),
            "nll_base": lambda r: _fsum(_f32(r.nll) * _f32(r.nll_base)),
        },
        served="exact",
        labels=("ln_ppl_ratio",),
    ),
    # KL(base‖q); llama.cpp keeps the double for its sums, float for percentiles
    Statistic(name="kld", dtype=np.float64, sums=_sum_and_square("kld", "kld2"), served="lower_bound", labels=("kld",)),
    Statistic(
        name="dp",  # p_q(target) - p_base(target)
        dtype=np.float32,
        sums={
            "dp": lambda r: _fsum(_f32(r.dp)),
            "dp2": lambda r: _fsum(_dp2(r)),
            "dp4": lambda r: _fsum(_dp2(r) * _dp2(r)),
        },
        served="exact",
        labels=("dp", "rms_dp"),
    ),
    # argmax agreement: counted beside the sums (the chunk vector's n_same)
    Statistic(name="same_top", dtype=np.bool_, served="top", labels=("same_top_p",)),
    # KL(q‖base) and the Jensen–Shannon divergence: lower bounds from a server's top K
    _divergence("rkld", "rkld_mean"),
    _divergence("jsd", "jsd_mean"),
    # |top-k(q) ∩ top-k(base)|
    _overlap(5),
    _overlap(10),
    # the base's largest probability
    Statistic(name="ptop_base", dtype=np.float32, sums=_sum("ptop_base"), served="exact", labels=("ptop_base",)),
    Statistic(
        name="ptop_q",  # the compared model's largest probability (its confidence)
        dtype=np.float32,
        sums={
            "ptop_q": lambda r: _fsum(_f64(r.ptop_q)),
            "dptop2": lambda r: _fsum((_f64(r.ptop_q) - _f64(r.ptop_base)) ** 2),
        },
        older=np.nan,
        served="top",
        labels=("ptop_q",),
    ),
    # top-K base rows: estimate of the KLD the unstored tail hides (else 0)
    Statistic(name="kld_tail", dtype=np.float64, sums=_sum("kld_tail"), filled=True),
    # both models' most probable token ids (the lowest id on a tie)
    Statistic(name="top1_q", dtype=np.int32, older=-1),
    Statistic(name="top1_base", dtype=np.int32, older=-1),
    # total variation ½ Σ |p - q|; where rows are known in part, its least value ...
    Statistic(
        name="tv", dtype=np.float64, sums=_sum_and_square("tv", "tv2"), older=np.nan, served="interval", labels=("tv",)
    ),
    # ... and its largest (= tv where both rows are whole)
    Statistic(name="tv_hi", dtype=np.float64, sums=_sum("tv_hi"), older=np.nan, filled=True),
    # the base's mass outside the entries known on both sides (0 for whole rows)
    Statistic(name="p_out", dtype=np.float32, sums=_sum("p_out"), older=np.nan, filled=True),
    # Σ p·q, the probability that both models sample the same token; where rows are known in
    # part, the sum over the entries known on both sides (a lower bound)
    Statistic(
        name="same_sample",
        dtype=np.float64,
        sums=_sum_and_square("same_sample", "same_sample2"),
        older=np.nan,
        served="lower_bound",
        labels=("same_sample_p",),
        mean="same_sample_p",
    ),
)
