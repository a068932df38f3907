"""How an engine runs a run's batches of windows. By default each batch is one call, in order,
on the calling thread; an engine that can do better (llama.cpp's contexts side by side:
llamacpp/lanes.py) returns its own schedule from ``Engine.schedule``. The runs see only this:
the calls in order with their results (:meth:`Schedule.scored` for compare, :meth:`Schedule.nlls`
for ppl) and what the first line says; the schedule opens the base-row feeds and starts the
reducer's warm-up itself, so a run hands it no callbacks."""

from __future__ import annotations

from typing import Callable, Iterator

from kldtool import reduce


class Schedule:
    parallel = 1  # calls in flight at once
    note = ""  # what a run's first line says of the schedule (nothing for one call at a time)

    def __init__(self, engine, batches: list[list]):
        self.engine, self.calls = engine, batches

    @property
    def rounds(self) -> int:
        """Calls one after another: what an ETA multiplies the first call's time by."""
        return -(-len(self.calls) // self.parallel)

    def reducer_loops(self) -> tuple[bool, bool]:
        """(whether calls reduce on one core, whether on every core): the compiled loops the
        reducer's warm-up loads."""
        return False, True

    def ready(self, engine, call: list) -> None:
        """Make ready what ``engine``'s first call needs, so the call goes straight to the model
        (nothing, unless the engine's schedule says otherwise)."""

    def scored(self, reader, warm: bool = False) -> Iterator[tuple[list, object]]:
        """compare: (call, the engine's records for its windows against ``reader``'s rows) for
        every call in order. ``warm``: a run's first schedule loads the host reducer's compiled
        loops on a thread once the first call is ready (numba's import holds the interpreter,
        which the engine's way into its first calls needs)."""
        beside = self._warm_reducer if warm and self.engine.reduces_here else None
        return self.run(_score, reader, beside)

    def nlls(self) -> Iterator[tuple[list, object]]:
        """ppl: (call, the float32 NLL of each of its windows' targets) for every call in order."""
        return self.run(_nll)

    def _warm_reducer(self) -> None:
        reduce.warm_up(self.engine.device, *self.reducer_loops())

    def run(self, work: Callable, reader=None, beside: Callable | None = None) -> Iterator[tuple[list, object]]:
        """(call, work(engine, call, source)) for every call in order, where ``source`` is the
        engine's feed of ``reader``'s rows over the chunks the calls will ask for, in that order
        (closed after the last call; None without a reader); ``beside()`` is called once the
        first call is ready (:meth:`ready`), before it runs."""
        source = open_feed(self.engine, reader, self.calls)
        try:
            if self.calls:
                self.ready(self.engine, self.calls[0])
            if beside:
                beside()
            for call in self.calls:
                yield call, work(self.engine, call, source)
        finally:
            if source is not None:
                source.close()


def open_feed(engine, reader, calls: list[list]):
    """``engine``'s feed of ``reader``'s base rows for ``calls``' windows, in order, or None."""
    return engine.rows_source(reader, [w.index for c in calls for w in c]) if reader is not None else None


def _score(engine, call: list, source) -> list:
    return engine.score(call, source)


def _nll(engine, call: list, source) -> list:
    return engine.nll(call)
