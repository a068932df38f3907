"""KLD attribution: how much of a quant's divergence each unit carries, measured by the mean KLD
against the base file, through the engine's own forward and the reducers ``compare`` uses.

- leave-one-in: the base model with only that unit's parameters taken from the quant;
- leave-one-out: the quant with only that unit restored to the base's values; reported as the
  gain, KLD(quant) - KLD(quant with the unit restored).

Each candidate is one forward of the evaluation windows with the unit's parameters swapped into
the model in place (and back), so no second model is held. Intervals are paired block bootstraps
over windows (stats/paired.py): leave-one-in against the base model's own run (the file's floor),
leave-one-out against the whole quant's run.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from kldtool.attribute.units import Unit
from kldtool.pipeline import engine_modes
from kldtool.pipeline.batching import groups
from kldtool.stats.accumulator import chunk_vector
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.paired import compare_runs

MODES = ("in", "out")


@contextmanager
def swapped(unit: Unit, values: dict):
    """The unit's parameters set to ``values`` (name -> tensor) for the block, then put back."""
    import torch

    params = dict(unit.module.named_parameters())
    where = {k: params[k] if unit.part is None else params[k][unit.part] for k in values}  # an expert: its slice
    saved = {k: where[k].detach().clone() for k in values}
    with torch.no_grad():
        for k, v in values.items():
            where[k].copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in saved.items():
                where[k].copy_(v)


def window_vectors(engine, reader, windows, held=None) -> np.ndarray:
    """Per window, compare's chunk vector (KLD, NLL, same-top ... sums) of the engine's model now;
    ``held``: the windows' rows already read (hold_rows), else read for this run."""
    source = held or engine_modes.rows_source(engine, reader, [w.index for w in windows])
    out = []
    try:
        for group in groups(windows, engine.windows_per_call(max(len(w.tokens) for w in windows))):
            out += [chunk_vector(r) for r in engine_modes.score(engine, group, source)]
    finally:
        close = getattr(source, "close", None)
        if close and held is None:
            close()
    return np.stack(out)


HOLD_BYTES = 1 << 30  # beside the model on its device; more windows than that are read each run


def hold_rows(engine, reader, windows):
    """The windows' base rows read once for the many runs over them; None where the engine
    reads rows its own way or they would take more than HOLD_BYTES."""
    frames = sum(len(reader.frames.of_chunk(w.index)) for w in windows)
    if engine_modes.scores_itself(engine) or frames * reader.frame_nbytes > HOLD_BYTES:
        return None
    from kldtool.logitsfile.held_rows import HeldRows

    return HeldRows(reader, [w.index for w in windows], engine.facts.device)


def paired_kld(a: np.ndarray, b: np.ndarray, spec: Bootstrap) -> dict:
    """Mean KLD of run ``a`` and of run ``b`` (chunk vectors of the same windows), their
    difference and its paired block-bootstrap interval."""
    m = compare_runs(a, b, spec)["kld_mean"]
    return {"kld_mean": m["a"], "versus": m["b"], "difference": m["difference"], "interval_95": m["interval_95"]}


def attribute_kld(
    engine, reader, windows, units: list[Unit], every: list[Unit], modes, spec: Bootstrap, progress=None
) -> dict:
    """unit name -> {"in": ..., "out": ...} (the modes asked for) for ``units``, plus the two
    reference runs; leave-one-out starts from the whole quant, ``every`` unit swapped in."""
    results: dict = {u.name: {} for u in units}
    done, total = 0, len(units) * len(modes) + ("out" in modes)
    held = hold_rows(engine, reader, windows)  # every unit's run scores the same windows

    def each(mode: str, values_of, reference, measured_first: bool, key: str) -> None:
        # One candidate per unit: its values swapped in, paired against the reference run.
        nonlocal done
        for u in units:
            with swapped(u, values_of(u)):
                v = window_vectors(engine, reader, windows, held)
            r = paired_kld(v, reference, spec) if measured_first else paired_kld(reference, v, spec)
            kld = r["kld_mean"] if measured_first else r["versus"]
            results[u.name][mode] = {"kld_mean": kld, key: r["difference"], "interval_95": r["interval_95"]}
            done += 1
            if progress:
                progress(done, total)

    base_vec = window_vectors(engine, reader, windows, held)
    if "in" in modes:
        each("in", lambda u: u.quant, base_vec, True, "above_base")
    quant_vec = None
    if "out" in modes:
        with all_swapped(every):
            quant_vec = window_vectors(engine, reader, windows, held)
            done += 1
            each("out", lambda u: u.base, quant_vec, False, "gain")
    refs = {"base_kld_mean": mean_kld(base_vec)}
    if quant_vec is not None:
        refs["quant_kld_mean"] = mean_kld(quant_vec)
    return {"units": results, "references": refs}


def mean_kld(v: np.ndarray) -> float:
    from kldtool.stats.bootstrap import chunk_statistics

    return float(chunk_statistics(v.sum(axis=0))["kld_mean"])


@contextmanager
def all_swapped(units: list[Unit]):
    from contextlib import ExitStack

    with ExitStack() as stack:
        for u in units:
            stack.enter_context(swapped(u, u.quant))
        yield
