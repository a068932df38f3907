"""The runs' passes over an engine (engines/contract.py): compare's records, base's rows, ppl's
NLLs and the hidden states, reduced here from a Model's logit blocks or taken from a Scorer,
which computes them where its logits are. Refusals name the engines that can."""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from kldtool.codec import Coding, target_nll
from kldtool.codec.encode import encode_base_slices
from kldtool.engines import registry
from kldtool.engines.contract import HIDDEN, ROUTING, SCHEDULE, SCORES
from kldtool.engines.schedule import Schedule
from kldtool.errors import UsageError
from kldtool.reduce import TokenRecords, reduce_base, on_host
from kldtool.text.protocols import Window


def scores_itself(engine) -> bool:
    return registry.has(engine, SCORES)


def schedule(engine, batches: list[list[Window]]) -> Schedule:
    """How ``engine`` runs ``batches``: its own schedule where it has one, else one call each."""
    return engine.schedule(batches) if registry.has(engine, SCHEDULE) else Schedule(engine, batches)


def scored(sched: Schedule, reader, warm: bool = False) -> Iterator[tuple[list, list[TokenRecords]]]:
    """compare: (call, each window's records against ``reader``'s rows) for every call in order.
    ``warm``: a run's first schedule loads the host reducer's compiled loops on a thread once
    the first call is ready (numba's import holds the interpreter, which the engine's way into
    its first calls needs)."""
    beside = sched.warm_reducer if warm and not scores_itself(sched.engine) else None
    return sched.run(score, lambda chunks: rows_source(sched.engine, reader, chunks), beside)


def nlls(sched: Schedule) -> Iterator[tuple[list, list[np.ndarray]]]:
    """ppl: (call, the float32 NLL of each of its windows' targets) for every call in order."""
    return sched.run(lambda engine, call, source: nll(engine, call))


def rows_source(engine, reader, chunks: list[int]):
    """What :func:`score` reads base rows from for ``chunks`` (asked for in that order): a
    Scorer's own, else their frames read ahead on threads; closed after the last of them."""
    if scores_itself(engine):
        return engine.rows_source(reader, chunks)
    from kldtool.logitsfile.prefetch import PrefetchedChunks

    return PrefetchedChunks(reader, chunks, device=engine.facts.device)


def score(engine, windows: list[Window], source) -> list[TokenRecords]:
    """Per window, its per-token records against the base rows ``source`` gives
    (``rows_torch(chunk, device, start, stop)`` beside torch logits, ``parts_numpy(chunk,
    start, stop)`` beside numpy ones), block by block: a long window never lies whole in memory."""
    if scores_itself(engine):
        return engine.score(windows, source)

    def reduce(w: Window, off: int, lg):
        n = len(lg)
        if not isinstance(lg, np.ndarray):
            rows = source.rows_torch(w.index, lg.device, off, off + n)
            return reduce_base(lg, rows, w.targets[off : off + n], source.header, defer=True)
        parts, a = [], 0  # on the host, frame by frame: the rows are never copied
        for rows in source.parts_numpy(w.index, off, off + n):
            b = a + len(rows)
            parts.append(reduce_base(lg[a:b], rows, w.targets[off + a : off + b], source.header))
            a = b
        return TokenRecords.concat(parts)

    return [TokenRecords.concat(p) for p in _per_block(engine, windows, reduce)]


def encode(engine, windows: list[Window], coding: Coding) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Base mode: (window number in ``windows``, uint16 base rows, or top-K records, made as
    ``coding`` says, float32 NLL of each of their targets), block by block in order, so the
    base file is written as the rows come and no window's rows are ever held whole."""
    if scores_itself(engine):
        yield from engine.encode(windows, coding)
        return
    for i, off, lg in engine.logit_blocks(windows):
        for rows, nll_ in encode_base_slices(lg, windows[i].targets[off : off + len(lg)], coding):
            yield i, rows, nll_


def nll(engine, windows: list[Window]) -> list[np.ndarray]:
    """Score mode: per window, the float32 NLL of each target (full-vocabulary normalisation)."""
    if scores_itself(engine):
        return engine.nll(windows)
    parts = _per_block(engine, windows, lambda w, off, lg: target_nll(lg, w.targets[off : off + len(lg)]))
    return [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]


def _per_block(engine, windows: list[Window], fn) -> list[list]:
    """fn(window, first row, logits) of every block, by window. A pending result (work queued
    on a device) is taken once the next block's is queued: the device works on that block
    while the host waits for and files this one."""
    parts: list[list] = [[] for _ in windows]
    held = None
    for i, off, lg in engine.logit_blocks(windows):
        got = fn(windows[i], off, lg)
        if held is not None:
            parts[held[0]].append(on_host(held[1]))
        held = (i, got)
    if held is not None:
        parts[held[0]].append(on_host(held[1]))
    return parts


def with_hidden_states(engine):
    """``engine`` where it gives its final hidden states and output head, else a usage error
    naming the engines that do."""
    if not registry.has(engine, HIDDEN):
        raise UsageError(
            f"--store hidden: the {engine.facts.name} engine does not give its final hidden states and output "
            f"head (the {registry.named_with(HIDDEN)} engines do); use --store logprobs"
        )
    return engine


def head_source(engine) -> str:
    """Where ``compare`` finds this engine's output head again (``base --head external``): the
    model's absolute path."""
    path = engine.facts.model
    if not path or not os.path.exists(path):
        raise UsageError(
            f"--head external: the {engine.facts.name} engine's model is not a file or directory ({path!r}) "
            f"that compare could read the head from; store it in the file (--head inline)"
        )
    return os.path.abspath(path)


def routing_shape(engine):
    """The engine's routers (routing/rows.py's RouterShape), or None: a dense model, or an
    engine that does not read routing."""
    return engine.routing_shape() if registry.has(engine, ROUTING) else None


def record_routing(engine):
    """Start recording each scored row's routing (the recorder's ``pop(window index)``)."""
    if not registry.has(engine, ROUTING):
        raise UsageError(
            f"--routing: the {engine.facts.name} engine does not record MoE routing ({registry.named_with(ROUTING)} "
            f"do; docs/metrics.md, 'MoE routing')"
        )
    return engine.record_routing()
