"""From the costs to a built recipe: solve for the target, build the choice with llama.cpp's
tensor-type overrides, measure it on the cost windows, fit one factor on the summed costs
(costs add only approximately: tensors' errors interact) and solve again, until the prediction
at the chosen point is within 10 % of what was measured, a few rounds at most.

Under a size target a common factor leaves the least-cost choice where it is: the second round
confirms the first's build under the corrected prediction. Under a KLD target it moves the
choice, and a round whose measured KLD is over the target asks for a larger recipe."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kldtool.errors import UsageError
from kldtool.recipe import knapsack
from kldtool.recipe.candidates import Candidates

WITHIN = 0.10


@dataclass(kw_only=True)
class Problem:
    cands: Candidates
    options: list[list[str]]  # per tensor (cands.tensors' order): its candidates' asked types
    sizes: list[list[int]]
    costs: list[list[float]]  # KLD above the base model's, per candidate: measured, or estimated (--prune)
    measured: list[list[bool]]
    floor: float  # the base model's own mean KLD against the base file
    table: knapsack.Table
    lower: np.ndarray  # the bound from below at each bucket count (the certificate)


def problem(cands: Candidates, cache, floor: float, estimate=None) -> Problem:
    """``estimate(tensor, written)``: the cost of a candidate the cache lacks (recipe/pruning.py)."""
    options, sizes, costs, measured = [], [], [], []
    for tensor in cands.tensors:
        opts = cands.options(tensor)
        options.append(list(opts))
        sizes.append([w.nbytes for w in opts.values()])
        records = [cache.get(tensor, w.sha256) for w in opts.values()]
        measured.append([r is not None for r in records])
        costs.append([max(0.0, r["above_base"]) if r is not None else estimate(tensor, w)
                      for r, w in zip(records, opts.values())])  # fmt: skip
    table, lower = knapsack.solve(sizes, costs, cands.fixed_bytes)
    return Problem(cands=cands, options=options, sizes=sizes, costs=costs, measured=measured, floor=floor,
                   table=table, lower=lower)  # fmt: skip


def chosen(p: Problem, at: int) -> dict:
    picks = knapsack.pick(p.table, at)
    types = {t: p.options[i][j] for i, (t, j) in enumerate(zip(p.cands.tensors, picks))}
    summed = sum(p.costs[i][j] for i, j in enumerate(picks))
    size = p.cands.fixed_bytes + sum(p.sizes[i][j] for i, j in enumerate(picks))
    lower = float(p.lower[min(at, len(p.lower) - 1)])
    estimated = sum(not p.measured[i][j] for i, j in enumerate(picks))
    return {"types": types, "summed_cost": float(summed), "size": int(size), "gap": max(summed - lower, 0.0),
            "lower": lower, "at": at, "estimated": estimated}  # fmt: skip


def at_for(p: Problem, target: tuple[str, float], alpha: float) -> tuple[int, bool]:
    """(the bucket count to solve at, whether the target is reachable by the prediction)."""
    kind, value = target
    if kind == "size":
        at = knapsack.buckets_for(p.table, int(value))
        if at is None:
            raise UsageError(
                f"a size of {int(value):,} bytes is below the smallest recipe of these types "
                f"({p.table.floor_bytes:,} bytes)"
            )
        return at, True
    ok = np.nonzero(p.floor + alpha * p.table.best <= value)[0]
    return (int(ok[0]), True) if len(ok) else (len(p.table.best) - 1, False)


def fit(rounds: list[dict], floor: float) -> float:
    """The factor on summed costs that best fits every measured round (least squares through 0)."""
    s = np.array([r["summed_cost"] for r in rounds])
    m = np.array([r["measured"] - floor for r in rounds])
    return float((s * m).sum() / (s * s).sum()) if (s * s).sum() > 0 else 1.0


def fixed_solve(p: Problem, target: tuple[str, float]):
    """The solver of a problem whose costs are all measured: at_for on it."""
    return lambda alpha: (p, *at_for(p, target, alpha))


def run_rounds(solve, target: tuple[str, float], measure, max_rounds: int, say) -> dict:
    """``solve(alpha)``: (the problem, the bucket count to pick at, reachable), every candidate
    it picks there measured (fixed_solve, or pruning.settling_solve); ``measure(types, k)``
    builds and measures round k's choice: {"measured": its mean KLD, and anything else to keep
    in the round's row (a mixture's routing flips)}."""
    alpha, rounds, seen = 1.0, [], {}
    reachable = True
    for k in range(1, max_rounds + 1):
        p, at, reachable = solve(alpha)
        pick = chosen(p, at)
        key = tuple(sorted(pick["types"].items()))
        if key not in seen:  # a choice made again is not built again: its round's file is it
            seen[key] = (measure(pick["types"], k), k)
        got, built = seen[key]
        measured = got["measured"]
        predicted = p.floor + alpha * pick["summed_cost"]
        row = {"round": k, "alpha": alpha, "predicted": predicted, "uncorrected": p.floor + pick["summed_cost"],
               "size": pick["size"], "gap": pick["gap"], "summed_cost": pick["summed_cost"], "built": built} | got  # fmt: skip
        row["error"] = abs(predicted - measured) / measured if measured > 0 else 0.0
        rounds.append(row)
        say(f"recipe: round {k}: {pick['size']:,} bytes, predicted KLD {predicted:.6f} (factor {alpha:.3f}), "
            f"measured {measured:.6f} ({100 * row['error']:.1f} % apart)")  # fmt: skip
        over = target[0] == "kld" and measured > target[1]
        if row["error"] <= WITHIN and not over:
            break
        if over and at == len(p.table.best) - 1:
            reachable = False
            break
        alpha = fit(rounds, p.floor)
        if over:  # refit moves the choice up; else nothing would change
            alpha = max(alpha, (measured - p.floor) / max(pick["summed_cost"], 1e-300) * (1 + 1e-9))
    last = rounds[-1]
    met = target[0] != "kld" or last["measured"] <= target[1]
    return {"rounds": rounds, "types": pick["types"], "alpha": last["alpha"], "reachable": reachable and met,
            "final": last, "problem": p}  # fmt: skip
