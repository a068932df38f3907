"""Several ways of doing the same work, timed in rotating order (so none always runs on a
warmer or cooler machine), best of each."""

from __future__ import annotations

import time
from typing import Callable


def best_alternating(runs: dict[str, Callable[[], None]], rounds: int,
                     sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Run each callable in ``runs`` once per round, the order rotated by one every round (two
    callables swap); returns each one's best wall time in seconds. ``sync`` waits for queued
    device work."""
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
    return {k: min(v) for k, v in times.items()}
