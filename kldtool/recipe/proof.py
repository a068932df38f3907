"""``recipe --proof MIX,...``: does the recipe beat llama.cpp's own mixes? Each mix is built from
the same source by llama-quantize's rules; the recipe and every mix are then scored by llama.cpp
on the held-out windows (the base file's windows after the cost windows, which the choice never
saw), and each mix is paired with the recipe by diff's chunk block bootstrap. A recipe that does
not beat a mix is reported as such. Each mix is also scored on the cost windows through the
costs' own forward (whole_file.py), so the frontier plot shows it on the frontier's scale."""

from __future__ import annotations

import os

from kldtool.errors import UsageError

MIN_HELD_OUT = 2  # the paired bootstrap resamples windows


def mix_names(spec: str | None) -> list[str]:
    """``--proof``'s mixes, each a type llama-quantize knows, checked before any cost is measured."""
    from kldtool.recipe.llamacpp_builds import check_type

    if spec is None:
        return []
    names = [n.strip().upper() for n in spec.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise UsageError(f"--proof {spec!r}: give distinct llama.cpp mixes, e.g. Q3_K_M,Q4_K_M")
    for n in names:
        check_type(n, f"--proof {spec!r}")
    return names


def _held_out(base_file: str, gguf: str, span: tuple[int, int], stem: str, spec) -> dict:
    """llama.cpp's compare of one GGUF on windows span[0]..span[1]-1, with its per-token file."""
    from kldtool.engines import EngineOptions
    from kldtool.pipeline.compare import compare_files
    from kldtool.pipeline.compare_job import CompareJob
    from kldtool.pipeline.sinks import Sinks

    job = CompareJob(base_path=base_file, engine=EngineOptions(engine="llamacpp", model=gguf),
                     chunk_range=f"{span[0]}:{span[1]}", per_token_path=stem + ".h5", json_path=stem + ".json",
                     bootstrap=spec)  # fmt: skip
    return compare_files(job, Sinks(out=lambda s: None))


def prove(base_file: str, recipe: str, mixes: dict[str, str], span: tuple[int, int], out_dir: str, spec) -> dict:
    """The held-out KLD of the recipe and of each mix, and recipe - mix with its 95 % interval."""
    from kldtool.analysis.diff import run_diff
    from kldtool.analysis.recipe_runs import verdict

    where = os.path.join(out_dir, "proof")
    os.makedirs(where, exist_ok=True)
    ours = _held_out(base_file, recipe, span, os.path.join(where, "recipe"), spec)
    rows = []
    for name, path in mixes.items():
        theirs = _held_out(base_file, path, span, os.path.join(where, name), spec)
        k = run_diff(os.path.join(where, "recipe.h5"), os.path.join(where, f"{name}.h5"), spec)["measures"]["kld_mean"]
        low, high = k["interval_95"]
        rows.append({
            "mix": name,
            "bytes": os.path.getsize(path),
            "kld": theirs["statistics"]["kld_mean"]["value"],
            "recipe_minus_mix": k["difference"],
            "interval_95": [low, high],
            "recipe_is": verdict(low, high),
        })  # fmt: skip
    return {
        "windows": [span[0], span[1] - 1],
        "engine": "llamacpp",
        "recipe": {"bytes": os.path.getsize(recipe), "kld": ours["statistics"]["kld_mean"]["value"]},
        "mixes": rows,
    }


def lines(proof: dict) -> list[str]:
    r = proof["recipe"]
    a, b = proof["windows"]
    return [
        f"proof on windows {a}-{b} (llama.cpp): {m['mix']} {m['bytes']:,} B, KLD {m['kld']:.6f}; recipe "
        f"{r['bytes']:,} B, KLD {r['kld']:.6f}; recipe - mix {m['recipe_minus_mix']:+.6f} "
        f"[{m['interval_95'][0]:+.6f}, {m['interval_95'][1]:+.6f}]: the recipe is {m['recipe_is']}"
        for m in proof["mixes"]
    ]
