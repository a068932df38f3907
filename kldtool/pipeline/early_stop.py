"""Stopping a compare run before its last window: ``--target-ci`` (once mean KLD is known to a
relative precision) and a cap on windows (one round of ``kldtool sweep``).

Either way the run scores its windows in segments that end where the rule looks
(``stats/sequential.py``): no batch of the engine runs across a look, so an engine that takes
all the windows in one call (vLLM) still stops there, and a stopped run resumed later evaluates
the batches an uninterrupted run with the same rule evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.errors import UsageError
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.sequential import DEFAULT_FIRST, Rule, target_met


@dataclass(frozen=True)
class Stopping:
    target: float | None = None  # --target-ci: relative half-width of mean KLD's interval
    first: int = DEFAULT_FIRST  # --min-chunks: the first look
    cap: int | None = None  # score at most this many windows (then the run is resumable)

    def __post_init__(self):
        if self.target is not None and not 0 < self.target < 1:
            raise UsageError(f"--target-ci {self.target}: expected a fraction of the mean, above 0 and below 1")
        if self.first < 2:
            raise UsageError(f"--min-chunks {self.first}: must be at least 2 (an interval needs two windows)")

    def rule(self, total: int, bootstrap: Bootstrap) -> Rule:
        return Rule(total, self.first, bootstrap=bootstrap)

    def ends(self, total: int) -> list[int]:
        """Where the segments end, as ascending counts of windows: each look, or the cap."""
        marks = Rule(total, self.first).looks if self.target is not None else [total]
        if self.cap is not None:
            marks = [m for m in marks if m < self.cap] + [min(self.cap, total)]
        return sorted(set(marks))

    def verdict(self, vectors: list, total: int, bootstrap: Bootstrap) -> dict | None:
        """Why the run stops after these windows' vectors, or None to go on."""
        n = len(vectors)
        if n >= total:
            return None
        if self.target is not None and n >= self.first:
            facts = self.rule(total, bootstrap).interval(vectors)
            if target_met(facts, self.target):
                return {"reason": "target", "target_ci": self.target} | facts
        if self.cap is not None and n >= self.cap:
            return {"reason": "cap", "cap": self.cap, "windows": n, "of": total}
        return None


def stop_line(stopped: dict, order) -> str:
    """The sentence a stopped run prints after its statistics."""
    head = f"Stopped after {stopped['windows']} of {stopped['of']} windows (order {order})"
    if stopped["reason"] == "cap":
        return head + f": the cap of {stopped['cap']} windows; --resume continues it"
    lo, hi = stopped["interval"]
    return (
        head + f": mean KLD {stopped['kld_mean']:.6f} in [{lo:.6f}, {hi:.6f}] for all {stopped['of']} windows "
        f"({stopped['level']:.0%}, {stopped['looks']} looks), half-width "
        f"{stopped['half_width'] / stopped['kld_mean']:.2%} <= --target-ci {stopped['target_ci']:.2%}"
    )
