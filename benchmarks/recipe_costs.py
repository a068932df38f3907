"""Where `kldtool recipe`'s costs spend their time: the built-in SmolLM2 (its Q4_1 GGUF as the
source) at six types, on the first --cost-windows windows of a WikiText-2 base file.

Timed one by one: llama-quantize's six --pure builds; the dequantized loads; the bare forward
of the cost windows (the model alone, no base rows, no reductions: the engine's own speed); a
candidate's run (forward from its layer up, the base rows, the reductions) at four layers, with
the rows read by each run and held once as recipe holds them, fitted as fixed + per-layer x
layers run, so the fixed part is what every candidate pays whatever its layer (the embedding,
the head, the rows, the reducers); then the whole cost run as `recipe` makes it (its
measure_costs into a fresh cost cache, rows held), against the sum the fit predicts. Prints the evaluations per tensor (distinct candidates), the share of each part
and the ratio of the cost run to one bare forward per candidate.

    .venv/bin/python benchmarks/recipe_costs.py [--work DIR] [--cost-windows 8] [--no-full]

The base file and the cost cache are recipe_frontier.py's (same --work default, same base,
same windows): a full run here leaves that benchmark its costs measured.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from recipe_work import arguments, base_file
from results import append_row

TYPES = ["Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q4_K", "Q6_K"]


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def bare_forward(model, windows) -> float:
    """The model over the cost windows in one call with the head on the scored rows only, as
    the engine runs it, logits made and dropped: no base rows, no reductions."""
    import torch

    ids = torch.from_numpy(np.stack([np.asarray(w.tokens, dtype=np.int64) for w in windows]))
    keep = ids.shape[1] - windows[0].first
    t0 = time.perf_counter()
    with torch.inference_mode():
        model(input_ids=ids, logits_to_keep=keep, use_cache=False)
    return time.perf_counter() - t0


def candidate_seconds(engine, reader, windows, cands, stored, quant, tensor: str, held=None, repeats: int = 3) -> float:
    """One candidate's run as measure_costs makes it (the best of ``repeats``); ``held``: the
    rows read once (as recipe does), else read and decompressed by the run."""
    from kldtool.attribute.kld import swapped, window_vectors
    from kldtool.recipe.costs import tensor_unit

    model = engine.model
    unit = tensor_unit(model, tensor, cands.params[tensor], quant[cands.params[tensor]])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        with swapped(unit, unit.quant), stored.starting_at(unit.layer):
            window_vectors(engine, reader, windows, held)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = arguments(argparse.ArgumentParser())
    ap.add_argument("--no-full", action="store_true", help="skip the whole cost run (the fit's sum only)")
    a = ap.parse_args()
    from kldtool.attribute.kld import hold_rows, window_vectors
    from kldtool.attribute.units import load_quant
    from kldtool.engines.defaults import default_gguf
    from kldtool.logitsfile import open_base_file
    from kldtool.provenance.identity import base_identity
    from kldtool.provenance.model_ref import content_hash
    from kldtool.recipe.candidates import find_candidates
    from kldtool.recipe.cost_cache import CostCache
    from kldtool.recipe.costs import block_of, measure_costs
    from kldtool.recipe.layer_reuse import LayerInputs
    from kldtool.recipe.llamacpp_builds import build_pure
    from kldtool.recipe.source import source_engine
    from kldtool.stats.bootstrap import Bootstrap
    from kldtool.text.protocols import stored_windows

    src, base = default_gguf(), base_file(a)
    builds = Path(tempfile.mkdtemp(prefix="recipe-costs-"))
    build_s = {t: timed(build_pure, src, t, str(builds))[1] for t in TYPES}
    reader = open_base_file(str(base))
    engine = source_engine(src, "float32", "cpu")
    windows = stored_windows(reader.tokens, reader.header, engine.facts.bos_id)[: a.cost_windows]
    cands = find_candidates(src, engine.model, TYPES, str(builds), lambda s: None)
    per_tensor = [len(cands.options(t)) for t in cands.tensors]
    layers = 1 + max(block_of(t) for t in cands.tensors)
    bare = min(bare_forward(engine.model, windows) for _ in range(3))
    stored = LayerInputs(engine.model)
    with stored.recording():
        window_vectors(engine, reader, windows)
    quants, load_s = {}, {}
    for t in ("Q4_0", "Q6_K"):
        quants[t], load_s[t] = timed(lambda p: load_quant(p, "float32").state_dict(), cands.builds[t])
    # a candidate's time against the layers it runs: the down projection at 4 depths, its rows
    # read by each run and held once (recipe's way)
    held = hold_rows(engine, reader, windows)
    depths = sorted({0, layers // 3, 2 * layers // 3, layers - 1})
    xs, ys, read = [], [], []
    for d in depths:
        xs.append(layers - d)
        name = f"blk.{d}.ffn_down.weight"
        read.append(candidate_seconds(engine, reader, windows, cands, stored, quants["Q4_0"], name))
        ys.append(candidate_seconds(engine, reader, windows, cands, stored, quants["Q4_0"], name, held))
    per_layer, fixed = np.polyfit(xs, ys, 1)
    read_fixed = np.polyfit(xs, read, 1)[1]
    runs = sum(per_tensor)  # none of the six is the source's own Q4_1, so every candidate runs
    predicted = sum(n * (fixed + per_layer * (layers - block_of(t))) for t, n in zip(cands.tensors, per_tensor))
    print(f"{len(cands.tensors)} tensors, {layers} layers; evaluations per tensor: "
          f"{ {int(k): int(v) for k, v in zip(*np.unique(per_tensor, return_counts=True))} } (distinct candidates -> tensors), "
          f"{runs} in all")  # fmt: skip
    print(f"builds: {sum(build_s.values()):.1f} s ({', '.join(f'{t} {s:.1f}' for t, s in build_s.items())})")
    print(f"dequantized load of a build: {np.mean(list(load_s.values())):.1f} s (x {len(TYPES)})")
    print(f"bare forward of the {len(windows)} cost windows: {bare:.3f} s")
    print(f"base rows held: {held.nbytes() / 2**20:.0f} MiB" if held else "base rows not held")
    print("a candidate's run, rows read each run: " + ", ".join(f"layer {d}: {y:.3f} s" for d, y in zip(depths, read))
          + f"; fixed part {read_fixed:.3f} s")  # fmt: skip
    print("a candidate's run, rows held: " + ", ".join(f"layer {d}: {y:.3f} s" for d, y in zip(depths, ys))
          + f"; fit {fixed:.3f} s fixed + {per_layer:.4f} s a layer run")  # fmt: skip
    print(f"predicted cost run: {predicted:.0f} s, of it fixed (embedding, head, rows, reductions) {runs * fixed:.0f} s; "
          f"a candidate's reductions (at layer 0, rows held, less the bare forward) {ys[0] - bare:.3f} s, "
          f"its rows' reading when not held {read[0] - ys[0]:.3f} s")  # fmt: skip
    figures = [f"{runs} candidates ({len(cands.tensors)} tensors)", f"builds {sum(build_s.values()):.0f} s",
               f"bare forward {bare:.3f} s", f"candidate {fixed:.3f} s fixed + {per_layer:.4f} s/layer",
               f"fixed part with rows read each run {read_fixed:.3f} s", f"predicted {predicted:.0f} s"]  # fmt: skip
    ratio = f"predicted cost run / ({runs} bare forwards): {predicted / (runs * bare):.2f}"
    if not a.no_full:
        identity = {"source": content_hash(src), "base_file": base_identity(reader),
                    "windows": [int(w.index) for w in windows], "dtype": "float32"}  # fmt: skip
        cache_path = a.work / "costs-cache.jsonl"
        if cache_path.exists():
            os.replace(cache_path, a.work / "costs-cache.jsonl.before")
        cache = CostCache(str(cache_path), identity)
        run = (engine, reader, windows, cands, cache, Bootstrap(1000, 0), "float32", None, held)
        (_, took), whole = timed(measure_costs, *run)
        print(f"whole cost run: {whole:.0f} s for {took['candidates']} candidates, {took['forwards']} forwards "
              f"(the fit predicted {predicted:.0f} s); with the builds {whole + sum(build_s.values()):.0f} s")  # fmt: skip
        figures.append(f"whole cost run {whole:.0f} s, {took['forwards']} forwards")
        ratio = f"cost run / ({took['forwards']} bare forwards): {whole / (took['forwards'] * bare):.2f}"
    print(ratio)
    reader.close()
    append_row(f"recipe_costs (SmolLM2 Q4_1 source, six types, {len(windows)} cost windows of c{a.c})",
               "; ".join(figures), ratio)  # fmt: skip


if __name__ == "__main__":
    main()
