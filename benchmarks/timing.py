"""Two ways of doing the same work, timed in alternating order (so neither always runs on a
warmer or cooler machine), best of each."""

from __future__ import annotations

import time
from typing import Callable


def best_alternating(runs: dict[str, Callable[[], None]], rounds: int,
                     sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Run the two callables in ``runs`` once per round, swapping their order every round;
    returns each one's best wall time in seconds. ``sync`` waits for queued device work."""
    (name_a, fn_a), (name_b, fn_b) = runs.items()
    times: dict[str, list[float]] = {name_a: [], name_b: []}
    for r in range(rounds):
        order = ((name_a, fn_a), (name_b, fn_b)) if r % 2 == 0 else ((name_b, fn_b), (name_a, fn_a))
        for name, fn in order:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r}: {name} {times[name][-1]:.3f} s", flush=True)
    return {k: min(v) for k, v in times.items()}
