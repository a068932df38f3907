"""routing/stats.py's statistics against a position-by-position computation in plain Python
(sets, math.log, float64 sums): overlaps, flips, the first departing layer, the router KL over
the base's experts, and the KLD split with its sums."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kldtool.routing.rows import Routed, RouterShape
from kldtool.routing.stats import RoutingStats

pytestmark = pytest.mark.quick

SHAPE = RouterShape((1, 2, 4), k=3, n_experts=10, scoring="softmax")


def draw(rng, n: int, like: np.ndarray | None = None) -> np.ndarray:
    """n x layers x k distinct expert ids; with ``like``, a copy with about a fifth of the sets changed."""
    ids = np.stack([rng.permutation(SHAPE.n_experts)[: SHAPE.k] for _ in range(n * len(SHAPE.layers))])
    ids = ids.reshape(n, len(SHAPE.layers), SHAPE.k)
    if like is None:
        return ids
    keep = rng.random((n, len(SHAPE.layers))) > 0.2
    return np.where(keep[..., None], like, ids)


def reference(windows) -> dict:
    n_layers, k = len(SHAPE.layers), SHAPE.k
    flips, overlap, kl, first = [0] * n_layers, [0.0] * n_layers, [0.0] * n_layers, [0] * (n_layers + 1)
    split = {"changed": [0, 0.0], "unchanged": [0, 0.0]}
    positions = 0
    for base, quant, kld in windows:
        for t in range(len(kld)):
            positions += 1
            departs = None
            for j in range(n_layers):
                sb, sq = set(base.ids[t, j].tolist()), set(quant.ids[t, j].tolist())
                overlap[j] += len(sb & sq) / k
                if sb != sq:
                    flips[j] += 1
                    departs = j if departs is None else departs
                p = [float(x) for x in base.probs[t, j]]
                p = [x / sum(p) for x in p]
                q = [float(quant.scores[t, j, e]) for e in base.ids[t, j]]
                q = [x / sum(q) for x in q]
                kl[j] += sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0)
            first[n_layers if departs is None else departs] += 1
            side = split["unchanged" if departs is None else "changed"]
            side[0] += 1
            side[1] += float(kld[t])
    return {"positions": positions, "flips": flips, "overlap": overlap, "kl": kl, "first": first, "split": split}


def test_the_statistics_equal_a_plain_computation():
    rng = np.random.default_rng(7)
    stats, windows = RoutingStats(SHAPE), []
    for n in (17, 5, 30):
        base_ids = draw(rng, n)
        quant_ids = draw(rng, n, base_ids)
        scores = rng.random((n, len(SHAPE.layers), SHAPE.n_experts)) + 0.01
        picked = np.take_along_axis(scores, base_ids, axis=-1)
        base = Routed(base_ids.astype(np.int16), (picked / picked.sum(-1, keepdims=True)).astype(np.float16))
        quant = Routed(quant_ids.astype(np.int16), np.zeros(quant_ids.shape, np.float32), scores * 1.3)
        kld = rng.random(n) * 0.01
        windows.append((base, quant, kld))
        stats.add(base, quant, kld)
    ref, got = reference(windows), stats.summary()
    n = ref["positions"]
    assert got["positions"] == n and got["windows"] == 3
    for j, row in enumerate(got["layers"]):
        assert row["flip_share"] == ref["flips"][j] / n
        assert row["mean_overlap"] == pytest.approx(ref["overlap"][j] / n, rel=1e-12)
        assert row["router_kl"] == pytest.approx(ref["kl"][j] / n, rel=1e-9)
    assert list(got["first_departing_layer"].values()) == ref["first"]
    for side in ("changed", "unchanged"):
        assert got["kld_split"][side]["tokens"] == ref["split"][side][0]
        assert got["kld_split"][side]["kld_sum"] == pytest.approx(ref["split"][side][1], rel=1e-12)


def test_truncating_keeps_the_first_windows_rows():
    rng = np.random.default_rng(3)
    stats = RoutingStats(SHAPE, skipped=2)  # a checkpoint's first 2 windows had no routing
    for n in (4, 6, 8):
        ids = draw(rng, n)
        stats.add(Routed(ids, np.full(ids.shape, 1 / 3, np.float32)), Routed(draw(rng, n, ids), ids * 0.0), np.zeros(n))
    stats.truncate(4)  # the run keeps its first 4 windows: 2 without routing, then 2 with
    assert stats.positions == 4 + 6 and stats.matrix().shape == (2, stats.width)
