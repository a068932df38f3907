"""Each tensor's cost at each of its candidates: the mean KLD over the cost windows of the base
model with only that tensor as llama.cpp wrote it (leave-one-in, attribute/kld.py's forward and
reducers), paired against the base model's own run for its excess and a bootstrap interval.

One forward of the cost windows per (tensor, distinct candidate): a tensor in decoder layer L
starts at L on the base run's stored inputs (layer_reuse.py), and a candidate whose values are
the source's own (a type requantized to itself) costs nothing and takes no forward. Candidates
are read one build at a time (one dequantized model beside the base), and every record goes to
the cost cache as it is measured."""

from __future__ import annotations

import re
import time

from kldtool.attribute.kld import paired_kld, swapped, window_vectors
from kldtool.attribute.units import Unit
from kldtool.recipe.candidates import Candidates
from kldtool.recipe.cost_cache import CostCache
from kldtool.engines.parameter_parts import part_of
from kldtool.recipe.expert_slots import composed
from kldtool.recipe.layer_reuse import LayerInputs

BLOCK = re.compile(r"^blk\.(\d+)\.")
ROWS = 4096  # rows of a tensor differenced at a time in float64


def block_of(tensor: str) -> int:
    """The decoder layer a GGUF tensor is in; 0 (the whole forward) for any other."""
    m = BLOCK.match(tensor)
    return int(m.group(1)) if m else 0


def tensor_unit(model, tensor: str, pname: str, values) -> Unit:
    """The parameter holding a GGUF tensor as an attribute unit with ``values`` to swap in."""
    module_name, _, leaf = pname.rpartition(".")
    module = model.get_submodule(module_name)
    base = getattr(module, leaf).detach().clone()
    return Unit(name=tensor, layer=block_of(tensor), module=module, quant={leaf: values}, base={leaf: base},
                numel=base.numel())  # fmt: skip


def _per_build(cands: Candidates, keep) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {t: [] for t in cands.types}
    for tensor in cands.tensors:
        for asked, w in cands.options(tensor).items():
            if keep(tensor, w):
                out[asked].append((tensor, w.sha256))
    return out


def pending(cands: Candidates, cache: CostCache, wanted: set | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per build (asked type), the (tensor, candidate digest) pairs still to measure there
    (only those in ``wanted`` where it is given)."""
    return _per_build(
        cands, lambda t, w: cache.get(t, w.sha256) is None and (wanted is None or (t, w.sha256) in wanted)
    )


def errors_pending(cands: Candidates, cache: CostCache) -> dict[str, list[tuple[str, str]]]:
    """Per build, the candidates whose weight error the cache lacks."""
    return _per_build(cands, lambda t, w: cache.error(t, w.sha256) is None)


def _weight_errors(model, quant: dict, cands: Candidates, items, cache: CostCache) -> None:
    """Each candidate's squared distance from the source's values, summed in float64 a slice of
    rows at a time (no float64 copy of a whole embedding)."""
    import torch

    for tensor, sha in items:
        pname, part = cands.params[tensor], cands.parts.get(tensor)
        q, b = part_of(quant[pname], part), part_of(model.get_parameter(pname).detach(), part)
        total = 0.0
        for start in range(0, q.shape[0], ROWS):
            d = q[start : start + ROWS].to(b.device, torch.float64) - b[start : start + ROWS].to(torch.float64)
            total += float((d * d).sum())
        cache.put_error(tensor, sha, total)


def measure_costs(
    engine, reader, windows, cands: Candidates, cache: CostCache, spec, dtype: str, progress=None, held=None,
    wanted: set | None = None, errors: bool = False,
):  # fmt: skip
    """Measure what the cache lacks (of ``wanted``, where given; with ``errors``, every
    candidate's weight error too); returns the base run's chunk vectors and what it took
    (forwards run, candidates measured, bytes of stored layer inputs); the cache holds the costs.
    ``held``: the windows' rows read once (attribute/kld.hold_rows)."""
    import torch

    from kldtool.attribute.units import load_quant

    model = engine.model
    stored = LayerInputs(model)
    with stored.recording():
        base_vec = window_vectors(engine, reader, windows, held)
    todo = pending(cands, cache, wanted)
    gaps = errors_pending(cands, cache) if errors else {t: [] for t in cands.types}
    total, done, forwards = sum(len(v) for v in todo.values()), 0, 0
    stored_bytes = stored.nbytes()
    for asked, items in todo.items():
        if not items and not gaps[asked]:
            continue
        quant = load_quant(cands.builds[asked], dtype).state_dict()
        _weight_errors(model, quant, cands, gaps[asked], cache)
        for tensor, sha in items:
            t0 = time.monotonic()
            w = cands.written[tensor][asked]
            pname = cands.params[tensor]
            values = composed(model, quant, cands.params, cands.parts, [tensor], model.device)[pname]
            unit = tensor_unit(model, tensor, pname, values)
            record = {"tensor": tensor, "sha256": sha, "asked": asked, "written": w.type_name, "bytes": w.nbytes}
            leaf = next(iter(unit.quant))
            if torch.equal(unit.quant[leaf].to(unit.base[leaf].dtype), unit.base[leaf]):
                record |= {"kld_mean": None, "above_base": 0.0, "interval_95": [0.0, 0.0], "source_values": True}
            else:
                with swapped(unit, unit.quant), stored.starting_at(unit.layer):
                    vec = window_vectors(engine, reader, windows, held)
                forwards += 1
                r = paired_kld(vec, base_vec, spec)
                record |= {"kld_mean": r["kld_mean"], "above_base": r["difference"], "interval_95": r["interval_95"]}
            record["seconds"] = round(time.monotonic() - t0, 3)
            cache.put(record)
            done += 1
            if progress:
                progress(done, total)
        del quant
    return base_vec, {"forwards": forwards, "candidates": total, "stored_inputs_bytes": stored_bytes}
