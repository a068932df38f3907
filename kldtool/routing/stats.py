"""Comparing two models' routing over the same positions: per routed layer, how often the chosen
set of experts differs, how many of the k stay, and the KL divergence between the two routers'
probabilities over the base's k; per position, the first layer that departs; and the run's KLD
split between positions whose routing changed somewhere and positions where it changed nowhere,
each with a block-bootstrap interval over windows (docs/metrics.md, "MoE routing")."""

from __future__ import annotations

import numpy as np

from kldtool.routing.rows import Routed, RouterShape, chosen_probs
from kldtool.stats.bootstrap import BATCH, Bootstrap, resample_weights

SIDES = ("changed", "unchanged")


def overlaps(base: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """|S_base ∩ S_quant| per position and layer (ids n x L x k on both sides, distinct in a set)."""
    return (base[..., :, None] == quant[..., None, :]).any(axis=-1).sum(axis=-1)


def router_kl(base: Routed, quant_scores: np.ndarray) -> np.ndarray:
    """KL(base ‖ quant) per position and layer over the base's k experts, each side's router
    probabilities renormalised over them (the base's as stored, in float16)."""
    p = base.probs.astype(np.float64)
    p = p / p.sum(axis=-1, keepdims=True)
    q = chosen_probs(quant_scores, base.ids)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return terms.sum(axis=-1)


class RoutingStats:
    """One row of sums per window, in the order the run scored them, so a checkpoint keeps them
    and an interrupted run cuts them back with its accumulator: positions, positions with the
    quant's scores, then per layer the flips, the overlap sums and the router KL sums, the
    first-departure counts (a last bin for none), and the KLD split (tokens and KLD sum where
    routing changed, then where it did not)."""

    def __init__(self, shape: RouterShape, rows: np.ndarray | None = None, skipped: int = 0):
        self.shape = shape
        n = len(shape.layers)
        self.width = 2 + 3 * n + (n + 1) + 4
        self.rows: list[np.ndarray] = [] if rows is None else list(np.asarray(rows, np.float64))
        self.skipped = skipped  # windows the run scored before routing was kept (an older checkpoint)

    def matrix(self) -> np.ndarray:
        return np.asarray(self.rows, np.float64).reshape(-1, self.width)

    def truncate(self, windows: int) -> None:
        """Keep the rows of the run's first ``windows`` windows."""
        del self.rows[max(0, windows - self.skipped) :]

    @property
    def positions(self) -> int:
        return int(sum(r[0] for r in self.rows))

    def _parts(self) -> dict:
        n, t = len(self.shape.layers), self.matrix().sum(axis=0)
        return {
            "positions": t[0],
            "kl_positions": t[1],
            "flips": t[2 : 2 + n],
            "overlap": t[2 + n : 2 + 2 * n],
            "kl": t[2 + 2 * n : 2 + 3 * n],
            "first": t[2 + 3 * n : 3 + 4 * n],
        }

    def add(self, base: Routed, quant: Routed, kld: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One window's positions; returns the first departing layer's index per position
        (len(layers) where none departs) and which layers changed (positions x layers)."""
        if base.ids.shape != quant.ids.shape or len(kld) != len(base):
            raise ValueError(f"routing of {base.ids.shape} against {quant.ids.shape} for {len(kld)} tokens")
        k, n_layers = self.shape.k, len(self.shape.layers)
        shared = overlaps(base.ids, quant.ids)
        changed = shared < k
        scored = quant.scores is not None
        kl = router_kl(base, quant.scores).sum(axis=0) if scored else np.zeros(n_layers)
        departs = changed.any(axis=1)
        first = np.where(departs, changed.argmax(axis=1), n_layers)
        kld = np.asarray(kld, np.float64)
        split = [departs.sum(), kld[departs].sum(), (~departs).sum(), kld[~departs].sum()]
        row = np.concatenate(
            [
                [len(base), len(base) if scored else 0],
                changed.sum(axis=0),
                shared.sum(axis=0) / k,
                kl,
                np.bincount(first, minlength=n_layers + 1),
                split,
            ]
        )
        self.rows.append(row.astype(np.float64))
        return first, changed

    def summary(self, bootstrap: Bootstrap = Bootstrap()) -> dict:
        p = self._parts()
        n, scored = max(p["positions"], 1), p["kl_positions"]
        layers = [
            {
                "layer": layer,
                "flip_share": float(p["flips"][i] / n),
                "mean_overlap": float(p["overlap"][i] / n),
                "router_kl": float(p["kl"][i] / scored) if scored else None,
            }
            for i, layer in enumerate(self.shape.layers)
        ]
        names = [str(x) for x in self.shape.layers] + ["none"]
        return {
            "shape": self.shape.describe(),
            "positions": int(p["positions"]),
            "windows": len(self.rows),
            "layers": layers,
            "first_departing_layer": dict(zip(names, (int(x) for x in p["first"]))),
            "kld_split": self._split(bootstrap),
        }

    def _split(self, bootstrap: Bootstrap) -> dict:
        v = self.matrix()[:, -4:]
        totals = v.sum(axis=0)
        tokens, kld_sum = totals[0] + totals[2], totals[1] + totals[3]
        bars = _intervals(v, bootstrap)
        out = {}
        for j, side in enumerate(SIDES):
            count, s = totals[2 * j], totals[2 * j + 1]
            out[side] = {
                "tokens": int(count),
                "share": float(count / tokens) if tokens else 0.0,
                "kld_sum": float(s),
                "kld_mean": float(s / count) if count else None,
                "interval_95": bars[j] if bars else None,
                "kld_share": float(s / kld_sum) if kld_sum > 0 else None,
            }
        return out


def _intervals(v: np.ndarray, spec: Bootstrap) -> list | None:
    """95 % percentile intervals of each side's mean KLD, resampling whole windows."""
    if len(v) < 2 or spec.resamples < 1:
        return None
    rng = np.random.default_rng(spec.seed)
    means: list[list[np.ndarray]] = [[], []]
    for start in range(0, spec.resamples, BATCH):
        size = min(BATCH, spec.resamples - start)
        drawn = resample_weights(rng.integers(0, len(v), size=(size, len(v))), len(v)) @ v
        for j in range(2):
            with np.errstate(divide="ignore", invalid="ignore"):
                means[j].append(drawn[:, 2 * j + 1] / drawn[:, 2 * j])
    bars = []
    for parts in means:
        x = np.concatenate(parts)
        x = x[np.isfinite(x)]
        bars.append([float(b) for b in np.percentile(x, [2.5, 97.5])] if len(x) else None)
    return bars
