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

Two drivers may write the same output at once. Their parts never meet: each run has an id (its
plan's digest and a random suffix) that names its parts, every part is written under a
temporary name of its own and opens with a record of the plan and windows it holds, the join
refuses a part of another plan or other windows in one line, and a driver removes only its own
parts. The output itself is written as a single run writes it (one writer at a time).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
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
    """On a worker: windows ``first .. stop-1`` scored, their blocks written to ``part``,
    which opens with the plan's digest and the windows it holds."""
    from kldtool.pipeline.batching import groups

    t = time.time()
    engine = job.engine_for()
    tmp = f"{part}.{secrets.token_hex(8)}.tmp"  # of this attempt alone: a retried shard never shares it
    try:
        setup = job.setup(engine, job.corpus_for())
        if _digest(setup) != digest:
            raise EngineError(
                f"shard of windows {first + 1}..{stop}: this node planned other windows than the first "
                f"task did (another tokenizer or text?)"
            )
        with open(tmp, "xb") as f:
            np.lib.format.write_array(f, _part_record(digest, first, stop), allow_pickle=False)
            for gi, group in enumerate(groups(setup.plan.windows[first:stop], setup.n_seq)):
                for i, rows, nll in engine_modes.encode(engine, group, setup.coding):
                    for a in (np.array([first // setup.n_seq + gi, i], np.int64), rows, nll):
                        np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, part)
    finally:
        engine.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"windows": [first, stop], "node": node_name(), "wall_time_s": round(time.time() - t, 3)}


def _part_record(digest: str, first: int, stop: int) -> np.ndarray:
    return np.frombuffer(json.dumps({"plan": digest, "windows": [first, stop]}).encode(), np.uint8)


class PartBlocks:
    """The parts' blocks, handed out group by group as write_run asks for them; each part is
    first checked to be of this run's plan and to hold the windows its shard was given."""

    def __init__(self, parts: list[str], n_seq: int, digest: str, ranges: list[tuple[int, int]]):
        self.parts, self.n_seq, self.digest, self.ranges = parts, n_seq, digest, ranges
        self._stream = self._blocks()
        self._next = next(self._stream, None)

    def _blocks(self):
        for path, (first, stop) in zip(self.parts, self.ranges):
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._check(path, f, first, stop)
                while f.tell() < size:
                    where, rows, nll = (np.lib.format.read_array(f, allow_pickle=False) for _ in range(3))
                    yield int(where[0]), int(where[1]), rows, nll

    def _check(self, path: str, f, first: int, stop: int) -> None:
        try:
            record = json.loads(np.lib.format.read_array(f, allow_pickle=False).tobytes())
            plan, windows = record["plan"], record["windows"]
        except (ValueError, KeyError, TypeError):
            raise EngineError(f"base: {os.path.basename(path)} is not a shard's part file") from None
        if plan != self.digest or windows != [first, stop]:
            raise EngineError(
                f"base: {os.path.basename(path)} holds windows {windows} of plan {str(plan)[:12]}, this run "
                f"expects {[first, stop]} of plan {self.digest[:12]}: another driver's part"
            )

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


@dataclass(kw_only=True)
class Scored:
    """What the cluster hands back: the run's setup and each shard's part file and facts."""

    setup: BaseSetup
    digest: str
    parts: list[str]
    ranges: list[tuple[int, int]]
    facts: list[dict]
    t0: float

    def join(self, job: BaseJob, sinks: Sinks | None = None) -> dict:
        """The base file from the parts (run after disconnecting: it prints the results), the
        parts removed whatever happens."""
        try:
            blocks = PartBlocks(self.parts, self.setup.n_seq, self.digest, self.ranges)
            result = write_run(self.setup, job, blocks, sinks or Sinks(), t0=self.t0)
        finally:
            remove_parts(self.parts)
        return result | {"shards": self.facts}


def remove_parts(parts: list[str]) -> None:
    """This run's parts and what its killed attempts left of them (names only this run uses)."""
    for p in parts:
        directory, name = os.path.split(p)
        for n in _listed(directory):
            if n == name or (n.startswith(name + ".") and n.endswith(".tmp")):
                try:
                    os.unlink(os.path.join(directory, n))
                except FileNotFoundError:
                    pass


def _listed(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def score_shards(ray, job: ShardedBase, shape, shards: int, sinks: Sinks | None = None) -> Scored:
    sinks = sinks or Sinks()
    t0 = time.time()
    options = shape.options()
    setup, digest, engine_name, corpus_name = ray.get(ray.remote(plan_task).options(**options).remote(job))
    sinks.info(describe_run(setup, job.job.protocol, corpus_name, engine_name))
    ranges = cuts(len(setup.plan.windows), setup.n_seq, shards)
    out_path = os.path.abspath(job.job.out_path)
    stem = os.path.join(os.path.dirname(out_path), "." + os.path.basename(out_path))
    run_id = f"{digest[:12]}-{secrets.token_hex(4)}"  # two drivers of one output never share a name
    parts = [f"{stem}.{run_id}.shard-{k + 1}-of-{len(ranges)}" for k in range(len(ranges))]
    sinks.info(f"base: {len(ranges)} shards on the Ray cluster: " + ", ".join(f"{a + 1}..{b}" for a, b in ranges))
    task = ray.remote(shard_task).options(**options)
    refs = [task.remote(job, digest, a, b, part) for (a, b), part in zip(ranges, parts)]
    try:
        facts = _gathered(ray, refs, ranges)
    except BaseException:
        remove_parts(parts)
        raise
    return Scored(setup=setup, digest=digest, parts=parts, ranges=ranges, facts=facts, t0=t0)


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
