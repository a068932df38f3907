"""One candidate per tensor at the least summed cost for every size: a multiple-choice knapsack
solved exactly by dynamic programming over byte buckets. Each tensor's bytes above its smallest
candidate are counted in whole buckets rounded up, so every answer fits the size it is given
for; the same program with bytes rounded down bounds from below what any choice could reach at
that size, and the difference is the answer's certificate (``gap``): how far from the true
optimum rounding can have left it. One pass gives the least cost at every size: the frontier."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BUCKETS = 100_000  # the bucket is the size range over this, at least one byte


@dataclass(kw_only=True)
class Table:
    bucket: int
    floor_bytes: int  # every tensor at its smallest candidate, plus the fixed bytes
    exact: np.ndarray  # least cost at exactly each bucket count above the floor (inf: none)
    best: np.ndarray  # least cost at most each bucket count: the frontier
    choices: list  # per tensor, per bucket count after it: the candidate taken (-1: none fits)
    weights: list  # per tensor, per candidate: buckets above its smallest


def _program(sizes: list[list[int]], costs: list[list[float]], bucket: int, up: bool):
    best = np.zeros(1)
    choices, weights = [], []
    for s, c in zip(sizes, costs):
        low = min(s)
        w = [(-(-(b - low) // bucket) if up else (b - low) // bucket) for b in s]
        new = np.full(len(best) + max(w), math.inf)
        pick = np.full(len(new), -1, dtype=np.int8)
        for j, (wj, cj) in enumerate(zip(w, c)):
            cand = best + cj
            seg = new[wj : wj + len(best)]
            better = cand < seg
            seg[better] = cand[better]
            pick[wj : wj + len(best)][better] = j
        best = new
        choices.append(pick)
        weights.append(w)
    return best, choices, weights


def solve(
    sizes: list[list[int]], costs: list[list[float]], fixed: int, buckets: int = BUCKETS
) -> tuple[Table, np.ndarray]:
    """(the table of answers, the lower bound at each bucket count). ``sizes``/``costs``: per
    tensor, per candidate."""
    spread = sum(max(s) - min(s) for s in sizes)
    bucket = max(1, -(-spread // buckets))
    exact, choices, weights = _program(sizes, costs, bucket, up=True)
    lower, _, _ = _program(sizes, costs, bucket, up=False)
    floor = fixed + sum(min(s) for s in sizes)
    table = Table(bucket=bucket, floor_bytes=floor, exact=exact, best=np.minimum.accumulate(exact), choices=choices,
                  weights=weights)  # fmt: skip
    return table, np.minimum.accumulate(lower)


def pick(table: Table, at: int) -> list[int]:
    """The candidate of each tensor in the least-cost answer within ``at`` buckets."""
    at = int(np.argmin(table.exact[: at + 1]))  # the first exact count with the least cost
    out = []
    for pick_row, w in zip(reversed(table.choices), reversed(table.weights)):
        j = int(pick_row[at])
        out.append(j)
        at -= w[j]
    return out[::-1]


def buckets_for(table: Table, size_bytes: int) -> int | None:
    """The bucket count a size allows (None: below the floor, no answer fits)."""
    if size_bytes < table.floor_bytes:
        return None
    return min((size_bytes - table.floor_bytes) // table.bucket, len(table.best) - 1)
