"""Connecting to a Ray cluster for a sweep, and the shape of each task on it.

``--ray ADDRESS``: ``auto`` is ``ray.init()``'s own discovery (RAY_ADDRESS, else a cluster this
machine runs, else a new local one), ``local`` a cluster of this machine alone that kldtool
starts and stops, anything else the address of a running cluster (``host:port``,
``ray://host:port``). Ray's own logs stay in its session directory: the driver's stderr shows
kldtool's lines only.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from dataclasses import dataclass, field

from kldtool.errors import UsageError


@dataclass(frozen=True)
class TaskShape:
    """What each turn asks of the node it runs on, and how often a lost one is run again."""

    cpus: float = 1.0
    gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    retries: int = 3

    def options(self) -> dict:
        return {
            "num_cpus": self.cpus,
            "num_gpus": self.gpus,
            "resources": dict(self.resources),
            "max_retries": self.retries,
            "retry_exceptions": False,  # a turn's own failure is an outcome, not a crash to repeat
        }

    def describe(self) -> str:
        asked = [f"{self.cpus:g} CPU"] + ([f"{self.gpus:g} GPU"] if self.gpus else [])
        asked += [f"{v:g} {k}" for k, v in self.resources.items()]
        return f"{', '.join(asked)}, rerun up to {self.retries} times if its worker dies"

    def threads(self) -> int:
        """The engine threads a turn uses when -t is not given: its CPUs, not the node's cores."""
        return max(1, int(self.cpus))


def parse_resources(pairs: list[str]) -> dict[str, float]:
    out = {}
    for p in pairs:
        name, sep, amount = p.partition("=")
        try:
            value = float(amount) if sep else 1.0
        except ValueError:
            value = -1.0
        if not name or value <= 0:
            raise UsageError(f"--ray-resource {p!r}: expected NAME or NAME=AMOUNT with an amount above 0")
        out[name] = value
    return out


def import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray on this machine and the cluster's: pip install 'kldtool[ray]'") from None
    return ray


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=10).close()
        return True
    except OSError:
        return False


def check_reachable(ray, address: str) -> None:
    """A HOST:PORT that does not answer is a one-line error now, not Ray's minutes of retries.
    Ray connects to a loopback address through the machine's outward one (unless
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0): that one must answer too."""
    if address in ("auto", "local") or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--ray {address}: expected auto, local or HOST:PORT of a running cluster")
    if not _answers(host, int(port)):
        raise UsageError(f"--ray {address}: nothing answers there (start the cluster with `ray start --head`)")
    try:  # Ray's own rule for a loopback address; private, so only a hint when it is there
        via = ray._private.services.resolve_ip_for_localhost(host)
    except Exception:
        return
    if via != host and not _answers(via, int(port)):
        raise UsageError(
            f"--ray {address}: Ray would reach it through {via}:{port}, which does not answer; for a "
            f"cluster bound to loopback set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 here too"
        )


@contextlib.contextmanager
def connected(address: str):
    """A driver connection for the length of the block (and, for ``local``, the cluster).
    Ray prints the cluster's error messages (a node lost, a task to be retried) to the driver's
    stdout from a thread of its own; stdout is kldtool's results, so while connected anything
    printed there goes to stderr (the sweep prints its table after disconnecting)."""
    ray = import_ray()
    check_reachable(ray, address)
    with contextlib.redirect_stdout(sys.stderr):
        yield from _session(ray, address)


def _session(ray, address: str):
    kw = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, **kw)
        else:
            ray.init(address=None if address == "auto" else address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--ray {address}: cannot connect to a Ray cluster there ({first})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def check_fits(ray, shape: TaskShape) -> None:
    """Refuse a task shape no node can hold (Ray would keep such a task pending for ever)."""
    want = {"CPU": shape.cpus, "GPU": shape.gpus} | shape.resources
    want = {k: v for k, v in want.items() if v > 0}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if any(all(n["Resources"].get(k, 0) >= v for k, v in want.items()) for n in nodes):
        return
    asked = ", ".join(f"{k} {v:g}" for k, v in want.items())
    have = "; ".join(
        f"{n['NodeManagerAddress']}: " + ", ".join(f"{k} {n['Resources'].get(k, 0):g}" for k in want) for n in nodes
    )
    raise UsageError(f"--ray: no node of the cluster has what each task asks ({asked}); nodes: {have}")
