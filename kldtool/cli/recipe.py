"""``kldtool recipe``: per-tensor types for a size or KLD target, from measured costs (recipe/)."""

from __future__ import annotations

import os
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import BOOTSTRAP, PROGRESS
from kldtool.cli.options import bootstrap_of, flags
from kldtool.errors import UsageError
from kldtool.runtime.progress import choose as choose_progress

MAX_TYPES = 32  # the knapsack keeps a candidate's index in a byte


@app.command()
@flags(bootstrap_flags=BOOTSTRAP, display=PROGRESS)
def recipe(
    src: str = typer.Argument(..., help="The GGUF to quantize from (F16/F32, or the model's own quant)."),
    base_file: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="The base file: its first --cost-windows windows price each tensor."
    ),
    types: str = typer.Option(
        "Q4_0,Q5_0,Q8_0,Q3_K,Q4_K,Q6_K", "--types", help="llama.cpp types to choose from, comma-separated."
    ),
    size: Optional[str] = typer.Option(None, "--size", help="The largest file: bytes, or 95MB, 1.5GiB ..."),
    bpw: Optional[float] = typer.Option(
        None, "--bpw", help="The largest size in bits per weight: file bits over every tensor's elements of the source."
    ),
    target_kld: Optional[float] = typer.Option(
        None, "--target-kld", help="The smallest recipe whose measured mean KLD is at most this."
    ),
    out_dir: str = typer.Option(..., "-o", "--output", help="Directory for the GGUF, the costs and the frontier."),
    cost_windows: int = typer.Option(8, "--cost-windows", help="The base file's first N windows price the tensors."),
    rounds: int = typer.Option(4, "--rounds", help="Build-measure-correct rounds at most."),
    cost_cache: Optional[str] = typer.Option(
        None, "--cost-cache", help="Measured costs, kept to resume (default OUT/costs-cache.jsonl)."
    ),
    proof: Optional[str] = typer.Option(
        None,
        "--proof",
        help="llama.cpp mixes to beat (e.g. Q3_K_M,Q4_K_M): built, and scored with the recipe by llama.cpp "
        "on the held-out windows, each paired with it.",
    ),
    prune: bool = typer.Option(
        False,
        "--prune",
        help="Measure each tensor's coarsest candidate, estimate the others from their weight error, and "
        "measure any estimated candidate a solve picks before it is built (fewer forwards).",
    ),
    dtype: str = typer.Option("float32", "--dtype", help="The transformers forward's dtype: float32, bfloat16."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N."),
    bootstrap_flags=None,
    display=None,
):
    """Choose each tensor's llama.cpp type for a size or KLD target from measured leave-one-in
    costs, build it with llama-quantize's tensor-type overrides and check the prediction."""
    choose_progress(display.progress)
    from kldtool.recipe.proof import lines, mix_names
    from kldtool.recipe.run import RecipeJob, run_recipe
    from kldtool.recipe.targets import target_of

    if base_file is None:
        raise UsageError("recipe needs --kl-divergence-base FILE (its first windows price the tensors)")
    if not os.path.isfile(src) or not src.lower().endswith(".gguf"):
        raise UsageError(f"{src}: no such GGUF file")
    names = [t.strip().upper() for t in types.split(",") if t.strip()]
    if not names or len(set(names)) != len(names) or len(names) > MAX_TYPES:
        raise UsageError(f"--types {types!r}: give 1 to {MAX_TYPES} distinct llama.cpp types, e.g. Q4_0,Q8_0")
    if cost_windows < 2:
        raise UsageError(f"--cost-windows {cost_windows}: at least 2 (the intervals resample windows)")
    if rounds < 1:
        raise UsageError(f"--rounds {rounds}: at least 1")
    target = target_of(size, bpw, target_kld, src)
    mixes = mix_names(proof)
    spec = bootstrap_of(bootstrap_flags)
    if mixes and spec.resamples < 1:
        raise UsageError("--proof pairs the recipe with each mix by a bootstrap: give --bootstrap N (N >= 1)")
    os.makedirs(out_dir, exist_ok=True)
    job = RecipeJob(src=src, base_file=base_file, types=names, target=target, out_dir=out_dir,
                    cost_windows=cost_windows, rounds=rounds, dtype=dtype, device=device, cache_path=cost_cache,
                    spec=spec, mixes=mixes, prune=prune)  # fmt: skip
    result = run_recipe(job)
    line = (
        f"recipe: {result['size']:,} bytes, mean KLD {result['measured_kld']:.6f} measured on the cost windows "
        f"(predicted {result['predicted_kld']:.6f}; additive prediction {100 * result['additive_prediction_error']:.1f} % off)"
    )
    print(line)
    if result.get("routing_flips"):
        f = result["routing_flips"]
        print(f"recipe: routing moved on {100 * f['decisions']:.2f} % of the (token, routed layer) choices, "
              f"{100 * f['tokens_any_layer']:.2f} % of tokens in some layer")  # fmt: skip
    for said in lines(result["proof"]) if result["proof"] else ():
        print(said)
    if not result["reachable"]:
        best = result["rounds"][-1]
        raise UsageError(
            f"--target-kld {target[1]}: unreachable with {', '.join(names)}; the best found measures "
            f"{best['measured']:.6f} at {best['size']:,} bytes ({out_dir}/recipe.gguf)"
        )
