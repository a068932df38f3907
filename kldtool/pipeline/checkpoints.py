"""Where a compare run checkpoints its accumulators, and a resumed run's start from its
checkpoint: checkpoints fall where one of the engine's batches ends, so a resumed run evaluates
the same batches and prints the same numbers."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kldtool.errors import StateError
from kldtool.provenance.identity import model_identity
from kldtool.pipeline.sinks import Sinks
from kldtool.analysis.state_file import RunState, check_fits, load_state
from kldtool.stats import KldAccumulator
from kldtool.text.window_order import order_of


@dataclass
class Checkpoints:
    """Where and how often the accumulators are saved: every ``chunks`` chunks or ``seconds``."""

    path: str | None = None
    chunks: int | None = None
    seconds: float = 60.0
    resume: bool = False


def start_state(ck: Checkpoints, meta: dict, sinks: Sinks) -> RunState:
    fresh = RunState(meta, KldAccumulator(meta.get("depth_bounds")))
    if not ck.resume:
        return fresh
    if not os.path.exists(ck.path):
        sinks.info(f"compare: no checkpoint at {ck.path} yet; starting from chunk {meta['chunk_range'][0] + 1}")
        return fresh
    state = load_state(ck.path)
    check_fits(state, ck.path, meta["base"], model_identity(meta["model"]), tuple(meta["chunk_range"]), order_of(meta))
    bounds = meta.get("depth_bounds")
    if state.acc.chunks and state.acc.depth_bounds is None:
        sinks.info(f"compare: note: {ck.path} was made by a kldtool that kept no depth buckets; this run keeps none")
    elif state.acc.chunks and state.acc.depth_bounds != (None if bounds is None else tuple(bounds)):
        raise StateError(f"{ck.path}: made with other --depth-bins; resume it with the ones it ran with")
    if state.meta.get("n_seq") != meta["n_seq"]:
        sinks.info(
            f"compare: note: the checkpoint was made with {state.meta.get('n_seq')} chunks per pass, "
            f"this run uses {meta['n_seq']}; batching can change the last digits"
        )
    sinks.info(f"compare: resuming {ck.path}, which holds {state.progress()}")
    resumed = state.meta.get("resumed", []) + [state.chunk_range[0] + state.visited]
    return RunState(meta | {"resumed": resumed}, state.acc, state.routing)
