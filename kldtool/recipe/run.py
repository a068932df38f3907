"""One ``kldtool recipe`` run: the source as a transformers model (dequantized by its GGUF
loader) scores the base file's first windows (the cost windows); every asked type is built and
each tensor's candidates measured (resumable); the knapsack and the correction rounds choose
and build the recipe; the files are written. The windows after the cost windows are left for
the proof, named in the result."""

from __future__ import annotations

import os
import sys
import time

from kldtool.errors import MismatchError, UsageError


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _measure_build(engine, reader, windows, cands, dtype, src, out_dir):
    """``measure(types, k)`` for the rounds: build round k's GGUF and score it on the windows."""
    from kldtool.attribute.kld import all_swapped, mean_kld, window_vectors
    from kldtool.attribute.units import load_quant
    from kldtool.recipe.costs import tensor_unit
    from kldtool.recipe.llamacpp_builds import build_recipe

    def measure(types: dict, k: int) -> float:
        dst = os.path.join(out_dir, f"round-{k}.gguf")
        build_recipe(src, cands, types, dst)
        q = load_quant(dst, dtype).state_dict()
        units = [
            tensor_unit(engine.model, t, cands.params[t], q[cands.params[t]].to(engine.model.device)) for t in types
        ]
        with all_swapped(units):
            return mean_kld(window_vectors(engine, reader, windows))

    return measure


def run_recipe(
    src, base_file, types, target, out_dir, cost_windows, max_rounds, dtype, device, cache_path, spec
) -> dict:
    from kldtool.attribute.kld import mean_kld
    from kldtool.logitsfile import open_base_file
    from kldtool.provenance.identity import base_identity
    from kldtool.provenance.model_ref import content_hash
    from kldtool.recipe.candidates import find_candidates
    from kldtool.recipe.cost_cache import CostCache
    from kldtool.recipe.costs import measure_costs, pending
    from kldtool.recipe.rounds import problem, run_rounds
    from kldtool.recipe.source import source_engine
    from kldtool.runtime.progress import Progress
    from kldtool.text.protocols import stored_windows

    t0 = time.monotonic()
    reader = open_base_file(base_file)
    try:
        engine = source_engine(src, dtype, device)
        if engine.facts.n_vocab != reader.header.n_vocab:
            raise MismatchError(
                f"{base_file}: written for a vocabulary of {reader.header.n_vocab}, {src} has {engine.facts.n_vocab}"
            )
        every = stored_windows(reader.tokens, reader.header, engine.facts.bos_id)
        if len(every) < cost_windows:
            raise UsageError(f"--cost-windows {cost_windows}: {base_file} has {len(every)} windows")
        windows, held_out = every[:cost_windows], [w.index for w in every[cost_windows:]]
        builds = os.path.join(out_dir, "builds")
        os.makedirs(builds, exist_ok=True)
        cands = find_candidates(src, engine.model, types, builds, _say)
        identity = {"source": content_hash(src), "base_file": base_identity(reader),
                    "windows": [int(w.index) for w in windows], "dtype": dtype}  # fmt: skip
        cache = CostCache(cache_path or os.path.join(out_dir, "costs-cache.jsonl"), identity)
        todo = sum(len(v) for v in pending(cands, cache).values())
        _say(f"recipe: {len(cands.tensors)} tensors, {len(types)} types, {todo} candidates to measure "
             f"(one forward each from the tensor's layer up, on {len(windows)} windows); "
             f"{len(cache.records)} in the cost cache")  # fmt: skip
        t_costs = time.monotonic()
        with Progress("recipe: costs", max(todo, 1), "candidates") as shown:
            base_vec, took = measure_costs(engine, reader, windows, cands, cache, spec, dtype, shown.to)
        took["seconds"] = round(time.monotonic() - t_costs, 2)
        p = problem(cands, cache, mean_kld(base_vec))
        result = run_rounds(
            p, target, _measure_build(engine, reader, windows, cands, dtype, src, out_dir), max_rounds, _say
        )
    finally:
        reader.close()
    final = os.path.join(out_dir, f"round-{result['final']['built']}.gguf")
    os.replace(final, os.path.join(out_dir, "recipe.gguf"))
    for r in result["rounds"]:
        leftover = os.path.join(out_dir, f"round-{r['round']}.gguf")
        if os.path.exists(leftover):
            os.unlink(leftover)
    return _write(p, cache, result, target, out_dir, windows, held_out, took, t0, src, base_file)


def _write(p, cache, result, target, out_dir, windows, held_out, took, t0, src, base_file) -> dict:
    from kldtool.recipe import outputs
    from kldtool.recipe.llamacpp_builds import lines_of
    from kldtool.runtime.small_files import write_json, write_text

    lines = lines_of(result["types"], p.cands)
    write_text(os.path.join(out_dir, "recipe.tensor-types.txt"), outputs.tensor_type_file(lines, p.cands.default_type))
    outputs.write_tables(out_dir, "costs", outputs.cost_rows(p, cache))
    points = outputs.frontier(p, result["alpha"])
    outputs.write_tables(out_dir, "frontier", points)
    outputs.plot(points, result["rounds"], [], os.path.join(out_dir, "frontier.png"))
    final = result["final"]
    summary = {
        "source": src,
        "base_file": base_file,
        "target": {"kind": target[0], "value": target[1]},
        "reachable": result["reachable"],
        "size": final["size"],
        "measured_kld": final["measured"],
        "predicted_kld": final["predicted"],
        "additive_prediction_error": abs(final["uncorrected"] - final["measured"]) / final["measured"]
        if final["measured"] > 0
        else 0.0,  # fmt: skip
        "gap": final["gap"],
        "base_kld": p.floor,
        "rounds": result["rounds"],
        "types": {t: p.cands.written[t][a].type_name for t, a in result["types"].items()},
        "default_type": p.cands.default_type,
        "cost_windows": [int(w.index) for w in windows],
        "held_out_windows": [int(i) for i in held_out],
        "costs_took": took,
        "knapsack": {"bucket_bytes": p.table.bucket, "buckets": len(p.table.best)},
        "seconds": round(time.monotonic() - t0, 2),
    }
    write_json(os.path.join(out_dir, "recipe.json"), summary)
    return summary
