"""What a Ray worker runs for one quant's turn: the base file opened on its node, the engine
built from the sweep's flags, and the turn played from the quant's state file.

Each attempt first appends a line to ``<label>.turns`` in the sweep directory (the round, the
node, the process), so the driver can tell a retried turn and where the live one runs. The
quant's lease (``<label>.lease``, runtime/lease.py) is held for the turn: a worker of an earlier
attempt that has not died yet (its driver was killed, its node is going down) finishes writing
before this one reads, and one that died leaves a lease the next attempt takes over (at once
on the same machine, after KLDTOOL_LEASE_STALE_S of no heartbeat elsewhere). It is a file, not
an ``flock``: that is node-local on NFSv3 and missing on some file systems.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Callable

from kldtool.errors import KldError
from kldtool.pipeline.sweep_play import Outcome, Play, Quant, play_quant
from kldtool.runtime.lease import Lease


def turns_path(q: Quant) -> str:
    return os.path.join(q.directory, q.label + ".turns")


def attempts(q: Quant, look: int) -> list[dict]:
    """The attempts at ``q``'s turn to ``look`` so far, oldest first."""
    try:
        with open(turns_path(q), encoding="utf-8") as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return []
    return [x for x in lines if isinstance(x, dict) and x.get("round") == look]


def node_name() -> str:
    import ray

    ctx = ray.get_runtime_context()
    return f"{ray.util.get_node_ip_address()} ({ctx.get_node_id()[:8]})"


def run_turn(play: Play, base, engine_for: Callable[..., object], q: Quant, look: int) -> Outcome:
    """A Ray task's body (cluster/ray_players.py submits it). ``base``: the base file's path, or
    a ``ShippedBase`` to fetch; ``engine_for(model, n_ctx)`` builds the engine (a picklable
    partial of the sweep's flags)."""
    from kldtool.logitsfile import open_base_file
    from kldtool.runtime.progress import choose

    choose("none")  # the driver shows progress, from the state files
    node = node_name()
    with open(turns_path(q), "a", encoding="utf-8") as f:
        f.write(json.dumps({"round": look, "node": node, "host": socket.gethostname(), "pid": os.getpid()}) + "\n")
    tried = len(attempts(q, look))
    t = time.time()
    with Lease(os.path.join(q.directory, q.label + ".lease")):
        try:
            reader = open_base_file(base if isinstance(base, str) else _fetched(base, play, q, look))
        except (KldError, OSError) as e:
            return Outcome(label=q.label, error=str(e), seconds=time.time() - t, node=node, attempts=tried)
        try:
            outcome = play_quant(play, reader, lambda model: engine_for(model, reader.header.n_ctx), q, look)
        finally:
            reader.close()
    outcome.node, outcome.attempts = node, tried
    return outcome


def _fetched(base, play: Play, q: Quant, look: int) -> str:
    """This node's copy of a shipped base file, with the windows this turn will score."""
    from kldtool.analysis.state_file import load_state
    from kldtool.cluster.shipped_base import visited

    done = len(load_state(q.state).acc.chunks) if os.path.exists(q.state) else 0
    return base.fetch(visited(play, done, look))
