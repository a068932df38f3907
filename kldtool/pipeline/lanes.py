"""Batches of windows scored side by side by an engine's lanes, their results handed on in order.

An engine that offers several lanes (``Engine.lanes``: llama.cpp contexts sharing one model)
gets batch k on lane k mod n; each lane runs on a thread of its own, with its own base-row
feed over its own chunks, and does its reductions on that thread alone (threadmode.one_core).
The consumer sees (batch, result) in batch order, exactly as one lane would hand them, so the
accumulators, the printed lines and the checkpoints do not depend on the lane count. A lane
runs at most ``AHEAD`` batches ahead of the consumer.

Where an engine can cut its batches into smaller pieces with the same logits
(``Engine.lane_pieces``: llama.cpp's batches at ubatch boundaries), the lanes take the pieces,
so a run's last round leaves no lane idle for long.

The batches that do not fill a last round of every lane (the fifth of five on two lanes) would
leave a core idle for a whole batch: they wait until every lane is done with the full rounds,
then run with all the lanes' threads shared among them (one batch: all of them, and its
reduction spread over every core again).

Stopping early (an error, Ctrl-C, a consumer that stops reading) waits for each lane's batch in
progress to end: an engine's context must not be freed under a decode.
"""

from __future__ import annotations

import queue
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from kldtool.threadmode import all_cores, one_core

AHEAD = 2


def lane_plan(engine, batches: list[list]) -> tuple[list, list[list]]:
    """(lanes, what they score one call at a time): ``batches`` as they are for one lane, cut
    into the engine's lane pieces for several."""
    pieces = [piece for batch in batches for piece in engine.lane_pieces(batch)]
    lanes = engine.lanes(len(pieces))
    return lanes, (pieces if len(lanes) > 1 else batches)


def alone_at_the_end(lanes: list, batches: list[list]) -> bool:
    """Whether one last call runs alone with every lane's threads (and its reduction on every
    core): a last round that only one lane has a call in."""
    return len(lanes) > 1 and len(batches) % len(lanes) == 1


def in_order(engine, lanes: list, batches: Sequence[list], work: Callable,
             open_source: Callable | None = None, beside: Callable | None = None) -> Iterator[tuple[list, object]]:
    """(batch, work(lane, batch, source)) for every batch in order, over ``lanes`` (what
    ``engine.lanes`` gave). ``open_source(chunks)`` makes a lane's base-row feed over the chunk
    indices it will ask for, in that order (it is closed after the lane's last batch); without
    it the source is None. ``beside()`` is called once every lane has its first call ready
    (``Engine.prepare``), not before: what it starts (numba's import and cache load) holds the
    interpreter for long stretches, and held the lanes' way into their first decodes 0.1-0.2 s."""
    if len(lanes) == 1:
        source = _open(open_source, batches)
        try:
            _prepare(lanes[0], batches)
            if beside:
                beside()
            for batch in batches:
                yield batch, work(lanes[0], batch, source)
        finally:
            if source is not None:
                source.close()
        return
    n = len(lanes)
    run = _Run(threading.Event(), threading.Barrier(n), len(batches) % n, sum(lane.threads for lane in lanes),
               alone_at_the_end(lanes, batches), threading.Semaphore(0))
    outs = [queue.Queue(maxsize=AHEAD) for _ in lanes]
    threads = [threading.Thread(target=_lane, args=(i, lane, batches[i::n], open_source, work, outs[i], run),
                                name=f"kldtool-lane-{i}", daemon=True) for i, lane in enumerate(lanes)]
    for t in threads:
        t.start()
    try:
        for _ in lanes:
            run.ready.acquire()
        if beside:
            beside()
        for k, batch in enumerate(batches):
            ok, got = outs[k % n].get()
            if not ok:
                raise got
            yield batch, got
    finally:
        run.stop.set()
        run.full_rounds.abort()  # a lane waiting for the others' full rounds stops waiting
        for t in threads:
            t.join()
        for lane in lanes:
            if lane is not engine:
                lane.close()


@dataclass
class _Run:
    stop: threading.Event  # the consumer takes no more results
    full_rounds: threading.Barrier  # every lane is done with its batches of the full rounds
    tail: int  # batches of the last, partial round (lanes 0 .. tail-1 have one each)
    threads: int  # all lanes' threads together
    alone: bool  # the last round is one call, run on every core (alone_at_the_end)
    ready: threading.Semaphore  # released once by each lane when its first call is ready (or it failed)


def _lane(i: int, engine, batches: list[list], open_source: Callable, work: Callable, out: queue.Queue,
          run: _Run) -> None:
    source = None
    tail = batches[-1:] if i < run.tail else []
    ready = False
    try:
        with one_core():
            source = _open(open_source, batches)
            _prepare(engine, batches)
            run.ready.release()
            ready = True
            for batch in batches[:len(batches) - len(tail)]:
                if run.stop.is_set():
                    return
                _hand_on(out, (True, work(engine, batch, source)), run.stop)
            if not run.tail:
                return
            run.full_rounds.wait()
            if not tail or run.stop.is_set():
                return
            engine.set_threads(run.threads // run.tail + (i < run.threads % run.tail))
            with (all_cores() if run.alone else nullcontext()):
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


def _prepare(engine, batches: Sequence[list]) -> None:
    if batches:
        engine.prepare(batches[0])


def lanes_note(lanes: list, batches: list[list]) -> str:
    """What a run's first line says of its lanes (and the windows each call takes): nothing for one."""
    if len(lanes) == 1:
        return ""
    per = max(map(len, batches))
    return (f", {len(lanes)} lanes side by side ({'+'.join(str(lane.threads) for lane in lanes)} threads, "
            f"{per} window{'s' if per > 1 else ''} a call)")


def _open(open_source: Callable | None, batches: Sequence[list]):
    return open_source([w.index for b in batches for w in b]) if open_source else None


def _hand_on(out: queue.Queue, item: tuple, stop: threading.Event) -> None:
    """Put ``item`` once there is room, unless the consumer has stopped taking results."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            pass
