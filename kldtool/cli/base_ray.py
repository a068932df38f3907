"""``kldtool base --ray ADDRESS --shards N``: the base command's flags turned into a job for the
Ray cluster (kldtool/cluster/base_shards.py), with the checks a cluster adds."""

from __future__ import annotations

import functools
import os
import types

from kldtool.cli.options import corpus_of, longest, open_engine
from kldtool.cli.ray_flags import task_flags, task_shape
from kldtool.errors import UsageError


def wants_cluster(cluster) -> bool:
    """Whether the run goes to a cluster (and its flags are refused without --ray)."""
    return task_shape(cluster, ["--shards"] * bool(cluster.shards)) is not None


def base_on_cluster(cluster, run, corpus, scoring, spec, model, out, settings: dict) -> dict:
    """``settings``: the format, codec, keep, clamp, frame rows, store and resume flags."""
    from kldtool.cluster.base_shards import BaseJob, score_shards
    from kldtool.cluster.node_checks import as_workers_see, check_nodes, local_paths
    from kldtool.cluster.ray_session import check_fits, connected
    from kldtool.pipeline.write_base import default_codec

    if not out or not cluster.shards:
        raise UsageError("base --ray needs --kl-divergence-base FILE and --shards N")
    if settings["store"] != "logprobs" or settings["resume"]:
        raise UsageError("base --ray: --store hidden and --resume run on one machine only")
    shape = task_shape(cluster, [])
    here, model = as_workers_see(corpus.file), as_workers_see(model)
    corpus = types.SimpleNamespace(**(vars(corpus) | {"file": here}))
    fmt = settings["fmt"]
    job = BaseJob(
        functools.partial(open_engine, task_flags(run, shape), model, longest(spec)),
        functools.partial(corpus_of, corpus, run.engine, model),
        spec,
        scoring.chunks,
        fmt,
        settings["codec"] or default_codec(fmt),
        settings["keep"],
        settings["clamp"],
        settings["frame_rows"],
        scoring.force,
    )
    directory = os.path.dirname(os.path.abspath(out))
    with connected(cluster.ray) as ray:
        check_fits(ray, shape)
        check_nodes(ray, local_paths(None, [p for p in (here, model) if p]), directory)
        scored = score_shards(ray, job, shape, cluster.shards, out)
    return scored.join(fmt, out)  # disconnected: stdout is the results' again
