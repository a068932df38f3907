"""``kldtool base --ray ADDRESS --shards N``: the base command's flags turned into a job for the
Ray cluster (kldtool/cluster/base_shards.py), with the checks a cluster adds."""

from __future__ import annotations

import functools
import os
import types
from dataclasses import replace

from kldtool.cli.options import corpus_of, longest, open_engine
from kldtool.cli.ray_flags import task_flags, task_shape
from kldtool.errors import UsageError


def wants_cluster(cluster) -> bool:
    """Whether the run goes to a cluster (and its flags are refused without --ray)."""
    return task_shape(cluster, ["--shards"] * bool(cluster.shards)) is not None


def base_on_cluster(cluster, engine_flags, corpus, model, job) -> dict:
    """``job``: pipeline/base_job.py's BaseJob of the command's flags."""
    from kldtool.cluster.base_shards import ShardedBase, score_shards
    from kldtool.cluster.node_checks import as_workers_see, check_nodes, local_paths
    from kldtool.cluster.ray_session import check_fits, connected

    if not job.out_path or not cluster.shards:
        raise UsageError("base --ray needs --kl-divergence-base FILE and --shards N")
    if job.store != "logprobs" or job.resume:
        raise UsageError("base --ray: --store hidden and --resume run on one machine only")
    if job.routing:
        raise UsageError("--routing: base --ray does not record routing yet; run it on one machine")
    shape = task_shape(cluster, [])
    here, model = as_workers_see(corpus.file), as_workers_see(model)
    corpus = types.SimpleNamespace(**(vars(corpus) | {"file": here}))
    sharded = ShardedBase(
        functools.partial(open_engine, task_flags(engine_flags, shape), model, longest(job.protocol)),
        functools.partial(corpus_of, corpus, engine_flags.engine, model),
        replace(job.resolved(), routing=False),
    )
    directory = os.path.dirname(os.path.abspath(job.out_path))
    with connected(cluster.ray) as ray:
        check_fits(ray, shape)
        check_nodes(ray, local_paths(None, [p for p in (here, model) if p]), directory)
        scored = score_shards(ray, sharded, shape, cluster.shards)
    return scored.join(sharded.job)  # disconnected: stdout is the results' again
