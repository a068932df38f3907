"""How an engine runs a run's batches of windows. By default each batch is one call, in order,
on the calling thread; an engine that can do better (llama.cpp's contexts side by side:
llamacpp/lanes.py) returns its own schedule from ``Engine.schedule``. The runs see only this:
the calls in order with the results of the work a run hands it (:meth:`Schedule.run`;
pipeline/engine_modes.py's ``scored`` for compare, ``nlls`` for ppl) and what the first line
says; the schedule opens the base-row feeds the run describes, one per lane."""

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

    def warm_reducer(self) -> None:
        """Load the host reducer's compiled loops this schedule's calls will use."""
        reduce.warm_up(self.engine.facts.device, *self.reducer_loops())

    def run(
        self, work: Callable, feed: Callable | None = None, beside: Callable | None = None
    ) -> Iterator[tuple[list, object]]:
        """(call, work(engine, call, source)) for every call in order, where ``source`` is
        ``feed(chunks)``, a feed of base rows over the chunks the calls will ask for, in that
        order (closed after the last call; None without a feed); ``beside()`` is called once
        the first call is ready (:meth:`ready`), before it runs."""
        source = open_feed(feed, self.calls)
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


def open_feed(feed: Callable | None, calls: list[list]):
    """``feed`` over ``calls``' windows' chunks, in order, or None."""
    return feed([w.index for c in calls for w in c]) if feed is not None else None
