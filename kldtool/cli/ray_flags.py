"""The flags that run ``sweep``'s turns and ``base``'s shards as tasks on a Ray cluster
(kldtool/cluster/): the cluster and each task's shape, ``sweep``'s --ship-base, ``base``'s
--shards."""

from __future__ import annotations

from typing import List, Optional

import typer

RAY = {
    "ray": (
        Optional[str],
        typer.Option(
            None,
            "--ray",
            metavar="ADDRESS",
            help="Run on a Ray cluster (sweep: each round's quants at once; base: --shards): auto "
            "(ray.init's discovery: RAY_ADDRESS or this machine's cluster), local (a cluster of this machine, "
            "started and stopped here), or HOST:PORT of a running cluster (docs/cluster.md).",
        ),
    ),
    "cpus": (
        float,
        typer.Option(1.0, "--ray-cpus-per-task", help="--ray: CPUs each task takes (and its engine's threads)."),
    ),
    "gpus": (float, typer.Option(0.0, "--ray-gpus-per-task", help="--ray: GPUs each task takes.")),
    "resources": (
        List[str],
        typer.Option(
            [], "--ray-resource", help="--ray: a custom resource each task takes, NAME or NAME=AMOUNT (repeat)."
        ),
    ),
    "retries": (
        int,
        typer.Option(3, "--ray-retries", min=0, help="--ray: how often a task whose worker or node died is rerun."),
    ),
}

# sweep only: the base file through the object store
SHIP = {
    "ship_base": (
        bool,
        typer.Option(
            False,
            "--ship-base",
            help="--ray: put the base file into Ray's object store once, for nodes that do not mount it; "
            "each node fetches only the windows its turns score.",
        ),
    ),
}

# base only: the windows cut into shards, one task each
SHARDS = {
    "shards": (
        Optional[int],
        typer.Option(
            None,
            "--shards",
            min=1,
            help="--ray: cut the windows into N shards (whole batches), each a task; the driver joins "
            "their part files into the one base file a single run writes.",
        ),
    ),
}


def task_shape(ns, only_with_ray: list[str]):
    """Each task's shape from the RAY flags (and refuse them, and ``only_with_ray``'s flags that
    are set, without --ray)."""
    from kldtool.cluster.ray_session import TaskShape, parse_resources
    from kldtool.errors import UsageError

    if ns.ray is None:
        named = ["--ray-cpus-per-task"] * (ns.cpus != 1.0) + ["--ray-gpus-per-task"] * bool(ns.gpus)
        named += ["--ray-resource"] * bool(ns.resources) + ["--ray-retries"] * (ns.retries != 3) + only_with_ray
        if named:
            raise UsageError(f"{', '.join(named)}: only with --ray ADDRESS")
        return None
    if ns.cpus <= 0 or ns.gpus < 0:
        raise UsageError("--ray-cpus-per-task must be above 0 and --ray-gpus-per-task at least 0")
    return TaskShape(ns.cpus, ns.gpus, parse_resources(ns.resources), ns.retries)


def task_flags(engine_flags, shape):
    """The ENGINE flags a task builds its engine from: -t unset, it takes the CPUs it asked
    for, not every core of its node."""
    import types

    return types.SimpleNamespace(**(vars(engine_flags) | {"threads": engine_flags.threads or shape.threads()}))
