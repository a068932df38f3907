"""The llama.cpp engine's schedule: batches of windows scored side by side on several
contexts sharing one model (lanes), their results handed on in order.

With several lanes (``LlamaCppEngine.lanes``), call k goes to lane k mod n; each lane runs on a
thread of its own, with its own base-row feed over its own chunks, and does its reductions on
that thread alone (core_share.one_core). The consumer sees (call, result) in call order, exactly
as one lane would hand them, so the accumulators, the printed lines and the checkpoints do not
depend on the lane count. A lane runs at most ``AHEAD`` calls ahead of the consumer.

Where the engine can cut its batches into smaller pieces with the same logits
(``LlamaCppEngine.lane_pieces``: llama.cpp's batches at ubatch boundaries), the lanes take the
pieces, so a run's last round leaves no lane idle for long.

The calls that do not fill a last round of every lane (the fifth of five on two lanes) would
leave a core idle for a whole call: they wait until every lane is done with the full rounds,
then run with all the lanes' threads shared among them (one call: all of them, and its
reduction spread over every core again).

Stopping early (an error, Ctrl-C, a consumer that stops reading) waits for each lane's call in
progress to end: an engine's context must not be freed under a decode.
"""

from __future__ import annotations

import queue
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

from kldtool.engines.schedule import Schedule, open_feed
from kldtool.compiled.core_share import all_cores, one_core

AHEAD = 2


class LaneSchedule(Schedule):
    """``batches`` as they are for one lane, cut into the engine's lane pieces for several."""

    def __init__(self, engine, batches: list[list]):
        pieces = [piece for batch in batches for piece in engine.lane_pieces(batch)]
        self.lanes = engine.lanes(len(pieces))
        super().__init__(engine, pieces if len(self.lanes) > 1 else batches)
        self.parallel = len(self.lanes)
        if self.parallel > 1:
            per = max(map(len, self.calls))
            self.note = (
                f", {self.parallel} lanes side by side ({'+'.join(str(lane.threads) for lane in self.lanes)} "
                f"threads, {per} window{'s' if per > 1 else ''} a call)"
            )

    def alone_at_the_end(self) -> bool:
        """Whether one last call runs alone with every lane's threads (and its reduction on
        every core): a last round that only one lane has a call in."""
        return self.parallel > 1 and len(self.calls) % self.parallel == 1

    def ready(self, engine, call: list) -> None:
        engine.prepare(call)  # its context, sized for the calls it will get

    def reducer_loops(self) -> tuple[bool, bool]:
        return self.parallel > 1, self.parallel == 1 or self.alone_at_the_end()

    def run(
        self, work: Callable, feed: Callable | None = None, beside: Callable | None = None
    ) -> Iterator[tuple[list, object]]:
        """As Schedule.run; ``beside()`` is called once every lane has its first call ready (a
        context made), not before: what it starts (numba's import and cache load) holds the
        interpreter for long stretches, and held the lanes' way into their first decodes."""
        if self.parallel == 1:
            yield from super().run(work, feed, beside)
            return
        lanes, calls, n = self.lanes, self.calls, self.parallel
        run = _Run(
            stop=threading.Event(),
            full_rounds=threading.Barrier(n),
            tail=len(calls) % n,
            threads=sum(lane.threads for lane in lanes),
            alone=self.alone_at_the_end(),
            ready=threading.Semaphore(0),
        )
        outs = [queue.Queue(maxsize=AHEAD) for _ in lanes]
        threads = [
            threading.Thread(
                target=_lane,
                args=(i, lane, calls[i::n], feed, work, outs[i], run),
                name=f"kldtool-lane-{i}",
                daemon=True,
            )
            for i, lane in enumerate(lanes)
        ]
        for t in threads:
            t.start()
        try:
            for _ in lanes:
                run.ready.acquire()
            if beside:
                beside()
            for k, call in enumerate(calls):
                ok, got = outs[k % n].get()
                if not ok:
                    raise got
                yield call, got
        finally:
            run.stop.set()
            run.full_rounds.abort()  # a lane waiting for the others' full rounds stops waiting
            for t in threads:
                t.join()
            for lane in lanes:
                if lane is not self.engine:
                    lane.close()


@dataclass(kw_only=True)
class _Run:
    stop: threading.Event  # the consumer takes no more results
    full_rounds: threading.Barrier  # every lane is done with its batches of the full rounds
    tail: int  # batches of the last, partial round (lanes 0 .. tail-1 have one each)
    threads: int  # all lanes' threads together
    alone: bool  # the last round is one call, run on every core (alone_at_the_end)
    ready: threading.Semaphore  # released once by each lane when its first call is ready (or it failed)


def _lane(
    i: int, engine, batches: list[list], feed: Callable | None, work: Callable, out: queue.Queue, run: _Run
) -> None:
    """Lane ``i``: its ``batches`` through ``engine`` (a context of its own) with a feed of its
    own over their chunks (``feed``), results handed on in order."""
    source = None
    tail = batches[-1:] if i < run.tail else []
    ready = False
    try:
        with one_core():
            source = open_feed(feed, batches)
            if batches:
                engine.prepare(batches[0])
            run.ready.release()
            ready = True
            for batch in batches[: len(batches) - len(tail)]:
                if run.stop.is_set():
                    return
                _hand_on(out, (True, work(engine, batch, source)), run.stop)
            if not run.tail:
                return
            run.full_rounds.wait()
            if not tail or run.stop.is_set():
                return
            engine.set_threads(run.threads // run.tail + (i < run.threads % run.tail))
            with all_cores() if run.alone else nullcontext():
                _hand_on(out, (True, work(engine, tail[0], source)), run.stop)
    except threading.BrokenBarrierError:  # the consumer stopped
        return
    except BaseException as e:  # the consumer raises it where this batch's result was due
        _hand_on(out, (False, e), run.stop)
    finally:
        if not ready:
            run.ready.release()
        if source is not None:
            source.close()


def _hand_on(out: queue.Queue, item: tuple, stop: threading.Event) -> None:
    """Put ``item`` once there is room, unless the consumer has stopped taking results."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            pass
