"""Several ways of doing the same work, timed in rotating order (so none always runs on a
warmer or cooler machine): best of each, or every round's times."""

from __future__ import annotations

import time
from typing import Callable


def best_alternating(
    runs: dict[str, Callable[[], None]], rounds: int, sync: Callable[[], None] = lambda: None
) -> dict[str, float]:
    """Run each callable in ``runs`` once per round, the order rotated by one every round (two
    callables swap); returns each one's best wall time in seconds. ``sync`` waits for queued
    device work."""
    return {k: min(v) for k, v in alternating(runs, rounds, sync).items()}


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """The median over rounds of ``num``'s time over ``den``'s in the same round. A shared VM's
    speed drifts by 20 % within minutes; two runs of one round see nearly the same machine, so
    this follows the tools' own difference where the ratio of best times follows the luckiest
    minute of each."""
    ratios = sorted(a / b for a, b in zip(times[num], times[den]))
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def alternating(
    runs: dict[str, Callable[[], None]], rounds: int, sync: Callable[[], None] = lambda: None
) -> dict[str, list[float]]:
    """As best_alternating, every round's wall time of each callable."""
    items = list(runs.items())
    times: dict[str, list[float]] = {name: [] for name, _ in items}
    for r in range(rounds):
        k = r % len(items)
        for name, fn in items[k:] + items[:k]:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r}: {name} {times[name][-1]:.3f} s", flush=True)
    return times
