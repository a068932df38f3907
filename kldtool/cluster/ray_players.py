"""A round's turns as Ray tasks: all of the round's players at once, each on a worker the
cluster chooses, the round over when every one has reported.

A task whose worker or node dies is run again by Ray (``TaskShape.retries`` times) and resumes
from the quant's state file; one whose model fails comes back as an outcome with its error. The
outcomes are handed back in the quants' order, whatever order they finished in, so the driver
prints and records what a sweep on one machine does.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from typing import Callable

from kldtool.cluster.live import Board
from kldtool.cluster.node_checks import as_workers_see, check_nodes, local_paths
from kldtool.cluster.ray_session import TaskShape, check_fits, connected
from kldtool.cluster.ray_task import attempts, run_turn
from kldtool.cluster.shipped_base import ShippedBase
from kldtool.pipeline.sinks import Sinks
from kldtool.pipeline.sweep_play import Outcome, Play, Quant

POLL_S = 1.0


@dataclass
class RayPlayers:
    ray: object  # the connected ray module
    base: object  # the base file's path on every node, or a ShippedBase
    engine_for: Callable[..., object]  # picklable: (model, n_ctx) -> engine
    shape: TaskShape

    def play(self, play: Play, todo: list[Quant], look: int, sinks: Sinks) -> list[Outcome]:
        ray = self.ray
        task = ray.remote(run_turn).options(**self.shape.options())
        refs = {task.remote(play, self.base, self.engine_for, _absolute(q), look): q for q in todo}
        outcomes: dict[str, Outcome] = {}
        with Board(todo, look) as board:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                for ref in done:
                    q = refs[ref]
                    outcomes[q.label] = self._gathered(ref, q, look)
                board.tick({refs[r].label for r in pending})
        out = [outcomes[q.label] for q in todo]
        for o in out:
            o.report(sinks)
        return out

    def _gathered(self, ref, q: Quant, look: int) -> Outcome:
        """The task's outcome, or an outcome naming what Ray reports once its retries are spent."""
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # an error of kldtool's that is not a KldError
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            error = f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
        except ray.exceptions.RayError as e:  # its worker or node lost more often than retried
            error = f"lost its worker ({type(e).__name__}) on every one of its attempts"
        tried = attempts(_absolute(q), look)
        return Outcome(label=q.label, error=error, node=tried[-1]["node"] if tried else None, attempts=len(tried))


def _absolute(q: Quant) -> Quant:
    """The quant as a worker, whose working directory is not the driver's, must name its files."""
    return replace(q, model=as_workers_see(q.model), directory=os.path.abspath(q.directory))


@contextlib.contextmanager
def on_cluster(address: str, shape: TaskShape, reader, ship: bool, engine_for, quants: list[Quant]):
    """Players on the cluster at ``address``, once it is checked that some node can hold a task
    and that every node sees the files (``ship``: all but the base file, put in the object
    store instead)."""
    sinks = Sinks()
    with connected(address) as ray:
        check_fits(ray, shape)
        directory = os.path.abspath(quants[0].directory)
        os.makedirs(directory, exist_ok=True)
        n = check_nodes(ray, local_paths(None if ship else reader.path, [q.model for q in quants]), directory)
        sinks.info(f"sweep: on the Ray cluster ({address}): {n} nodes checked, each task {shape.describe()}")
        base = os.path.abspath(reader.path)
        if ship:
            base = ShippedBase.put(ray, reader)
            sinks.info(
                f"sweep: {base.name} in the object store ({base.size:,} bytes, {len(base.windows)} windows); "
                f"each node fetches the windows its turns score"
            )
        yield RayPlayers(ray, base, engine_for, shape)
