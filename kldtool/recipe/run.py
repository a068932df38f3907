"""One ``kldtool recipe`` run: the source as a transformers model (dequantized by its GGUF
loader) scores the base file's first windows (the cost windows); every asked type is built and
each tensor's candidates measured (resumable); the knapsack and the correction rounds choose
and build the recipe; the files are written. The windows after the cost windows are left for
the proof, named in the result."""

from __future__ import annotations

import os
import sys
import time

from dataclasses import dataclass, field

from kldtool.analysis.recipe_runs import KIND as RESULT_KIND
from kldtool.errors import MismatchError, UsageError
from kldtool.recipe.proof import MIN_HELD_OUT


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _measure_build(engine, reader, windows, cands, dtype, src, out_dir, held):
    """``measure(types, k)`` for the rounds: build round k's GGUF and score it on the windows;
    for a mixture of experts, with its routing flips against the source's routing there."""
    from kldtool.attribute.kld import window_vectors
    from kldtool.recipe import routing_flips
    from kldtool.recipe.llamacpp_builds import build_recipe
    from kldtool.recipe.whole_file import score_file

    source = None
    if routing_flips.routes(engine.model):
        with routing_flips.ChosenExperts(engine.model) as caught:
            window_vectors(engine, reader, windows, held)
        source = caught.chosen()

    def measure(types: dict, k: int) -> dict:
        dst = os.path.join(out_dir, f"round-{k}.gguf")
        build_recipe(src, cands, types, dst)
        if source is None:
            return {"measured": score_file(engine, reader, windows, cands, dtype, dst, list(types), held)}
        with routing_flips.ChosenExperts(engine.model) as caught:
            kld = score_file(engine, reader, windows, cands, dtype, dst, list(types), held)
        return {"measured": kld, "routing_flips": routing_flips.flips(source, caught.chosen())}

    return measure


@dataclass(frozen=True, kw_only=True)
class RecipeJob:
    src: str
    base_file: str
    types: list
    target: tuple  # (kind, value): targets.py
    out_dir: str
    cost_windows: int
    rounds: int
    dtype: str
    device: str
    cache_path: str | None
    spec: object  # the bootstrap
    mixes: list = field(default_factory=list)  # --proof: llama.cpp mixes to beat on the held-out windows
    prune: bool = False  # --prune: measure the coarsest candidates, estimate the rest (pruning.py)


def _windows(job: RecipeJob, reader, engine):
    from kldtool.text.protocols import stored_windows

    if engine.facts.n_vocab != reader.header.n_vocab:
        raise MismatchError(
            f"{job.base_file}: written for a vocabulary of {reader.header.n_vocab}, {job.src} has {engine.facts.n_vocab}"
        )
    every = stored_windows(reader.tokens, reader.header, engine.facts.bos_id)
    if len(every) < job.cost_windows:
        raise UsageError(f"--cost-windows {job.cost_windows}: {job.base_file} has {len(every)} windows")
    held_out = [int(w.index) for w in every[job.cost_windows :]]
    if job.mixes and len(held_out) < MIN_HELD_OUT:
        raise UsageError(f"--proof: {job.base_file} has {len(held_out)} window(s) after the cost windows; "
                         f"the proof needs {MIN_HELD_OUT}")  # fmt: skip
    return every[: job.cost_windows], held_out


def run_recipe(job: RecipeJob) -> dict:
    from kldtool.attribute.kld import hold_rows
    from kldtool.logitsfile import open_base_file
    from kldtool.provenance.identity import base_identity
    from kldtool.provenance.model_ref import content_hash
    from kldtool.recipe.candidates import find_candidates
    from kldtool.recipe.cost_cache import CostCache
    from kldtool.recipe.llamacpp_builds import build_mixes
    from kldtool.recipe.rounds import run_rounds
    from kldtool.recipe.source import source_engine
    from kldtool.recipe.whole_file import score_file

    t0, out_dir = time.monotonic(), job.out_dir
    reader = open_base_file(job.base_file)
    try:
        engine = source_engine(job.src, job.dtype, job.device)
        windows, held_out = _windows(job, reader, engine)
        source = content_hash(job.src)
        builds = os.path.join(out_dir, "builds", source[:16])  # another source's builds are never this one's
        os.makedirs(builds, exist_ok=True)
        cands = find_candidates(job.src, engine.model, job.types, builds, _say)
        identity = {"source": source, "base_file": base_identity(reader),
                    "windows": [int(w.index) for w in windows], "dtype": job.dtype}  # fmt: skip
        cache = CostCache(job.cache_path or os.path.join(out_dir, "costs-cache.jsonl"), identity)
        held = hold_rows(engine, reader, windows)  # every candidate scores the same windows
        costs = _Costs(engine, reader, windows, cands, cache, job, held)
        solve = costs.solver()
        measure = _measure_build(engine, reader, windows, cands, job.dtype, job.src, out_dir, held)
        result = run_rounds(solve, job.target, measure, job.rounds, _say)
        p, took = result["problem"], costs.took
        mixes = build_mixes(job.src, job.mixes, builds)
        points = [{"name": n, "bytes": os.path.getsize(f),
                   "kld": score_file(engine, reader, windows, cands, job.dtype, f, cands.tensors, held)}
                  for n, f in mixes.items()]  # fmt: skip
        engine.close()  # the proof loads llama.cpp's models beside none of it
    finally:
        reader.close()
    final = os.path.join(out_dir, f"round-{result['final']['built']}.gguf")
    os.replace(final, os.path.join(out_dir, "recipe.gguf"))
    for r in result["rounds"]:
        leftover = os.path.join(out_dir, f"round-{r['round']}.gguf")
        if os.path.exists(leftover):
            os.unlink(leftover)
    proof = _prove(job, mixes, held_out)
    return _write(p, cache, result, job, windows, held_out, took, t0, points, proof)


class _Costs:
    """The costs phase: every candidate measured, or (--prune) the coarsest ones, with every
    candidate's weight error, and the rest when a solve picks them; ``took`` sums the passes."""

    def __init__(self, engine, reader, windows, cands, cache, job: RecipeJob, held):
        from kldtool.recipe import pruning

        self.args = (engine, reader, windows, cands, cache, job.spec, job.dtype)  # measure_costs' first seven
        self.cands, self.cache, self.windows = cands, cache, windows
        self.job, self.held, self.took, self.floor = job, held, {"forwards": 0, "candidates": 0, "seconds": 0.0}, None
        if job.prune:
            self.measure(pruning.anchors(cands), errors=True, what="coarsest candidates")
            self.measure(pruning.unestimable(cands, cache), what="candidates with no estimate")
        else:
            self.measure(None, what="candidates")

    def measure(self, wanted, errors: bool = False, what: str = "candidates") -> None:
        from kldtool.attribute.kld import mean_kld
        from kldtool.recipe.costs import measure_costs, pending
        from kldtool.runtime.progress import Progress

        cands, cache = self.cands, self.cache
        todo = sum(len(v) for v in pending(cands, cache, wanted).values())
        if self.floor is not None and not todo:
            return
        _say(f"recipe: {len(cands.tensors)} tensors, {len(self.job.types)} types, {todo} {what} to measure "
             f"(one forward each from the tensor's layer up, on {len(self.windows)} windows); "
             f"{len(cache.records)} in the cost cache")  # fmt: skip
        t = time.monotonic()
        with Progress("recipe: costs", max(todo, 1), "candidates") as shown:
            base_vec, took = measure_costs(*self.args, shown.to, self.held, wanted=wanted, errors=errors)
        self.floor = mean_kld(base_vec)
        self.took["forwards"] += took["forwards"]
        self.took["candidates"] += took["candidates"]
        self.took["stored_inputs_bytes"] = took["stored_inputs_bytes"]
        self.took["seconds"] = round(self.took["seconds"] + time.monotonic() - t, 2)

    def solver(self):
        from kldtool.recipe import pruning
        from kldtool.recipe.rounds import fixed_solve, problem

        cands, cache = self.cands, self.cache
        if not self.job.prune:
            return fixed_solve(problem(cands, cache, self.floor), self.job.target)
        return pruning.settling_solve(cands, cache, self.floor, self.job.target,
                                      lambda wanted: self.measure(wanted, what="picked candidates"), _say)  # fmt: skip


def _prove(job: RecipeJob, mixes: dict, held_out: list[int]) -> dict | None:
    from kldtool.recipe.proof import prove

    if not mixes:
        return None
    recipe = os.path.join(job.out_dir, "recipe.gguf")
    return prove(job.base_file, recipe, mixes, (held_out[0], held_out[-1] + 1), job.out_dir, job.spec)


def _write(p, cache, result, job: RecipeJob, windows, held_out, took, t0, mixes: list, proof: dict | None) -> dict:
    from kldtool.recipe import outputs
    from kldtool.recipe.llamacpp_builds import lines_of
    from kldtool.runtime.small_files import write_json, write_text

    out_dir = job.out_dir
    lines = lines_of(result["types"], p.cands)
    write_text(os.path.join(out_dir, "recipe.tensor-types.txt"), outputs.tensor_type_file(lines, p.cands.default_type))
    outputs.write_tables(out_dir, "costs", outputs.cost_rows(p, cache))
    points = outputs.frontier(p, result["alpha"])
    outputs.write_tables(out_dir, "frontier", points)
    outputs.plot(points, result["rounds"], mixes, os.path.join(out_dir, "frontier.png"))
    final = result["final"]
    summary = {
        "kldtool": RESULT_KIND,
        "source": job.src,
        "base_file": job.base_file,
        "target": {"kind": job.target[0], "value": job.target[1]},
        "reachable": result["reachable"],
        "size": final["size"],
        "measured_kld": final["measured"],
        "predicted_kld": final["predicted"],
        "additive_prediction_error": abs(final["uncorrected"] - final["measured"]) / final["measured"]
        if final["measured"] > 0
        else 0.0,  # fmt: skip
        "gap": final["gap"],
        "routing_flips": final.get("routing_flips"),  # a mixture of experts' (routing_flips.py)
        "base_kld": p.floor,
        "rounds": result["rounds"],
        "types": {t: p.cands.written[t][a].type_name for t, a in result["types"].items()},
        "default_type": p.cands.default_type,
        "cost_windows": [int(w.index) for w in windows],
        "held_out_windows": [int(i) for i in held_out],
        "costs_took": took,
        "knapsack": {"bucket_bytes": p.table.bucket, "buckets": len(p.table.best)},
        "mixes_on_cost_windows": mixes,
        "frontier": points,
        "proof": proof,
        "seconds": round(time.monotonic() - t0, 2),
    }
    write_json(os.path.join(out_dir, "recipe.json"), summary)
    return summary
