"""One quant's turn in a sweep round: its compare resumed from its state file and taken to the
round's look, wherever it runs (this process, or a worker of a Ray cluster: cluster/).

A turn that fails for a reason of its own (a model that does not load, a state file of another
model) ends as an ``Outcome`` with the one-line error instead of raising, so the sweep goes on
with the other quants. The state is saved wherever one of the engine's batches ends, so a turn
cut short (a worker or node lost, the driver killed) loses at most the batch in flight.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from kldtool.errors import KldError
from kldtool.pipeline.checkpoints import Checkpoints
from kldtool.pipeline.compare import run_compare
from kldtool.pipeline.compare_job import CompareJob
from kldtool.pipeline.early_stop import Stopping
from kldtool.pipeline.sinks import Sinks
from kldtool.stats.bootstrap import Bootstrap
from kldtool.text.window_order import Order


@dataclass(frozen=True)
class Quant:
    label: str
    model: str
    directory: str

    @property
    def state(self) -> str:
        return os.path.join(self.directory, self.label + ".state.npz")

    @property
    def result(self) -> str:
        return os.path.join(self.directory, self.label + ".json")


@dataclass(kw_only=True, frozen=True)
class Play:
    """What every quant's turn shares: the windows, their order and the stopping rule's start."""

    span: tuple[int, int]
    order: Order
    first: int
    bootstrap: Bootstrap
    force: bool


@dataclass(kw_only=True)
class Outcome:
    """How one quant's turn ended: its windows and mean KLD, or the error that failed it."""

    label: str
    windows: int = 0
    kld_mean: float | None = None
    error: str | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # the compare's warnings
    node: str | None = None  # where it ran, on a cluster
    attempts: int = 1

    def line(self) -> str:
        where = f" on {self.node}" if self.node else ""
        tried = f", attempt {self.attempts}" if self.attempts > 1 else ""
        if self.error:
            return f"sweep: {self.label}: failed{where}{tried}: {self.error}"
        return (
            f"sweep: {self.label}: {self.windows} windows, mean KLD {self.kld_mean:.6f} "
            f"({self.seconds:.1f} s{where}{tried})"
        )

    def report(self, sinks: Sinks) -> None:
        """The turn's warnings, then its line, on the driver's stderr."""
        for note in self.notes:
            sinks.info(f"{self.label}: {note}")
        sinks.info(self.line())

    def facts(self, look: int) -> dict:
        """The turn's record in sweep.json."""
        out = {"round": look, "quant": self.label, "wall_time_s": round(self.seconds, 3), "attempts": self.attempts}
        if self.node:
            out["node"] = self.node
        if self.error:
            out["error"] = self.error
        return out


def play_quant(play: Play, reader, engine_for: Callable[[str], object], q: Quant, look: int) -> Outcome:
    """Take ``q``'s compare to ``look`` windows (or its stop), resuming its state file."""
    t = time.time()
    notes: list[str] = []
    try:
        engine = engine_for(q.model)
        try:
            quiet = Sinks(out=lambda s: None, info=lambda s: s.startswith("warning") and notes.append(s))
            a, b = play.span
            job = CompareJob(
                force=play.force,
                json_path=q.result,
                chunk_range=f"{a}:{b}",
                checkpoints=Checkpoints(q.state, chunks=1, resume=True),
                bootstrap=play.bootstrap,
                order=play.order,
                stopping=Stopping(first=play.first, cap=look),
            )
            result = run_compare(engine, reader, job, quiet, label=f"sweep: {q.label}")
        finally:
            engine.close()
    except KldError as e:
        return Outcome(label=q.label, error=str(e), seconds=time.time() - t, notes=notes)
    stats = result["statistics"]
    return Outcome(
        label=q.label,
        windows=result["windows_scored"],
        kld_mean=stats["kld_mean"]["value"],
        error=None,
        seconds=time.time() - t,
        notes=notes,
    )


@dataclass
class LocalPlayers:
    """Every turn in this process, one quant after another."""

    reader: object
    engine_for: Callable[[str], object]  # model -> engine

    def play(self, play: Play, todo: list[Quant], look: int, sinks: Sinks) -> list[Outcome]:
        out = []
        for q in todo:
            outcome = play_quant(play, self.reader, self.engine_for, q, look)
            outcome.report(sinks)
            out.append(outcome)
        return out
