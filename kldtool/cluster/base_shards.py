"""``kldtool base --ray ADDRESS --shards N``: the base pass cut into shards of whole batches,
each a Ray task, joined by the driver into the file a single run writes.

A first task builds the run's plan on a worker (the driver loads no model): the windows, the
header, the metadata and the batch size. Each shard's task builds the same plan on its node,
checks that it is the same (a node with another tokenizer would cut other windows), scores its
windows batch by batch as a single run would (a shard starts where a batch starts, so the
engine sees the same batches and computes the same logits) and writes their rows and NLL to a
part file beside the output, atomically. The driver then streams the parts, in order, through
the same writer a single run uses: the same file (for llama.cpp's layout, the same bytes; the
container differs only in what it records of the run, its time and shards) and the same lines.
A shard whose worker dies is run again from its start; the parts are removed once joined.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kldtool.cluster.ray_task import node_name
from kldtool.errors import EngineError, KldError
from kldtool.pipeline import engine_modes
from kldtool.pipeline.base_job import BaseJob
from kldtool.pipeline.sinks import Sinks
from kldtool.pipeline.write_base import BaseSetup, describe_run, setup_base, write_run


@dataclass(frozen=True)
class ShardedBase:
    """What every task needs to build the run's plan: picklable partials of the CLI's builders,
    and the run's job (pipeline/base_job.py)."""

    engine_for: Callable[[], object]
    corpus_for: Callable[[], object]
    job: BaseJob

    def setup(self, engine, corpus) -> BaseSetup:
        return setup_base(engine, corpus, self.job)


def _digest(setup: BaseSetup) -> str:
    h = hashlib.sha256(np.ascontiguousarray(setup.plan.stream).tobytes())
    h.update(f"{len(setup.plan.windows)}:{setup.n_seq}:{setup.header}".encode())
    return h.hexdigest()


def plan_task(job: ShardedBase) -> tuple[BaseSetup, str, str, str]:
    """On a worker: the run's setup, its digest, the engine's name and the corpus's."""
    engine = job.engine_for()
    try:
        corpus = job.corpus_for()
        setup = job.setup(engine, corpus)
        return setup, _digest(setup), engine.facts.name, corpus.name
    finally:
        engine.close()


def shard_task(job: ShardedBase, digest: str, first: int, stop: int, part: str) -> dict:
    """On a worker: windows ``first .. stop-1`` scored, their blocks written to ``part``."""
    from kldtool.pipeline.batching import groups

    t = time.time()
    engine = job.engine_for()
    try:
        setup = job.setup(engine, job.corpus_for())
        if _digest(setup) != digest:
            raise EngineError(
                f"shard of windows {first + 1}..{stop}: this node planned other windows than the first "
                f"task did (another tokenizer or text?)"
            )
        with open(part + ".tmp", "wb") as f:
            for gi, group in enumerate(groups(setup.plan.windows[first:stop], setup.n_seq)):
                for i, rows, nll in engine_modes.encode(engine, group, setup.coding):
                    for a in (np.array([first // setup.n_seq + gi, i], np.int64), rows, nll):
                        np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part + ".tmp", part)
    finally:
        engine.close()
    return {"windows": [first, stop], "node": node_name(), "wall_time_s": round(time.time() - t, 3)}


class PartBlocks:
    """The parts' blocks, handed out group by group as write_run asks for them."""

    def __init__(self, parts: list[str], n_seq: int):
        self.parts, self.n_seq = parts, n_seq
        self._stream = self._blocks()
        self._next = next(self._stream, None)

    def _blocks(self):
        for path in self.parts:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                while f.tell() < size:
                    where, rows, nll = (np.lib.format.read_array(f, allow_pickle=False) for _ in range(3))
                    yield int(where[0]), int(where[1]), rows, nll

    def __call__(self, group):
        g = group[0].index // self.n_seq
        if self._next is None or self._next[0] != g:  # a part cut short would shift every window after it
            raise EngineError(f"base: the shards' part files lack windows {group[0].index + 1}..{group[-1].index + 1}")
        while self._next is not None and self._next[0] == g:
            _, i, rows, nll = self._next
            yield i, rows, nll
            self._next = next(self._stream, None)


def cuts(n_windows: int, n_seq: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` ranges of whole batches, as even as the batches allow (none empty)."""
    n_groups = -(-n_windows // n_seq)
    shards = min(shards, n_groups)
    bounds = [k * n_groups // shards for k in range(shards + 1)]
    return [(a * n_seq, min(b * n_seq, n_windows)) for a, b in zip(bounds, bounds[1:])]


@dataclass
class Scored:
    """What the cluster hands back: the run's setup and each shard's part file and facts."""

    setup: BaseSetup
    parts: list[str]
    facts: list[dict]
    t0: float

    def join(self, job: BaseJob, sinks: Sinks | None = None) -> dict:
        """The base file from the parts (run after disconnecting: it prints the results), the
        parts removed whatever happens."""
        try:
            result = write_run(self.setup, job, PartBlocks(self.parts, self.setup.n_seq), sinks or Sinks(), t0=self.t0)
        finally:
            remove_parts(self.parts)
        return result | {"shards": self.facts}


def remove_parts(parts: list[str]) -> None:
    for p in parts:
        for leftover in (p, p + ".tmp"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def score_shards(ray, job: ShardedBase, shape, shards: int, sinks: Sinks | None = None) -> Scored:
    sinks = sinks or Sinks()
    t0 = time.time()
    options = shape.options()
    setup, digest, engine_name, corpus_name = ray.get(ray.remote(plan_task).options(**options).remote(job))
    sinks.info(describe_run(setup, job.job.protocol, corpus_name, engine_name))
    ranges = cuts(len(setup.plan.windows), setup.n_seq, shards)
    out_path = os.path.abspath(job.job.out_path)
    stem = os.path.join(os.path.dirname(out_path), "." + os.path.basename(out_path))
    parts = [f"{stem}.shard-{k + 1}-of-{len(ranges)}" for k in range(len(ranges))]
    sinks.info(f"base: {len(ranges)} shards on the Ray cluster: " + ", ".join(f"{a + 1}..{b}" for a, b in ranges))
    task = ray.remote(shard_task).options(**options)
    refs = [task.remote(job, digest, a, b, part) for (a, b), part in zip(ranges, parts)]
    try:
        facts = _gathered(ray, refs, ranges)
    except BaseException:
        remove_parts(parts)
        raise
    return Scored(setup, parts, facts, t0)


def _gathered(ray, refs, ranges) -> list[dict]:
    out = []
    for ref, (a, b) in zip(refs, ranges):
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            if isinstance(cause, KldError):
                raise cause from None
            raise EngineError(f"base: the shard of windows {a + 1}..{b} failed: {type(cause).__name__}: {cause}")
        except ray.exceptions.RayError as e:
            raise EngineError(
                f"base: the shard of windows {a + 1}..{b} lost its worker on every attempt ({type(e).__name__})"
            ) from None
    return out
