"""Before a sweep's first task: every node of the cluster must see the files the tasks open
(the base file unless it is shipped, each model given as a path) and be able to write the sweep
directory. One small task pinned to each node looks; a path some node cannot see is a one-line
error naming the node, before any model is loaded anywhere."""

from __future__ import annotations

import os

from kldtool.errors import UsageError


def _look(paths: list[str], writable: str) -> list[str]:
    """On a node: what of ``paths`` it cannot read, and the directory if it cannot write it."""
    missing = [p for p in paths if not os.access(p, os.R_OK)]
    if not (os.path.isdir(writable) and os.access(writable, os.W_OK | os.X_OK)):
        missing.append(writable + " (to write)")
    return missing


def check_nodes(ray, paths: list[str], writable: str) -> int:
    """How many nodes were checked; raises on the first node that lacks something."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    look = ray.remote(num_cpus=0, max_retries=0)(_look)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            paths, writable
        )
        for n in nodes
    ]
    try:
        answers = ray.get(refs, timeout=300)
    except ray.exceptions.GetTimeoutError:
        raise UsageError("--ray: not every node answered the file check within 300 s (see `ray status`)") from None
    for node, missing in zip(nodes, answers):
        if missing:
            raise UsageError(
                f"--ray: node {node['NodeManagerAddress']} ({node['NodeID'][:8]}) cannot see "
                f"{', '.join(missing)}; put it on a filesystem every node mounts at the same path"
                + (" (or --ship-base for the base file)" if paths and missing[0] == paths[0] else "")
            )
    return len(nodes)


def as_workers_see(path: str | None) -> str | None:
    """A path this machine has, made absolute (a worker's working directory is not the
    driver's); anything else (a hub id, None) as it is."""
    return os.path.abspath(path) if path and os.path.exists(path) else path


def local_paths(base_path: str | None, models: list[str]) -> list[str]:
    """The paths the tasks will open: the base file (None: shipped) and each model this machine
    has as a file or directory (others are hub ids, fetched by each node itself)."""
    return ([os.path.abspath(base_path)] if base_path else []) + [
        as_workers_see(m) for m in models if os.path.exists(m)
    ]
