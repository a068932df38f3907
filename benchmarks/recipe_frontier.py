"""Does `kldtool recipe` beat llama.cpp's own mixes at their sizes? The built-in SmolLM2 (its
Q4_1 GGUF is the source, as every requant in this project), a WikiText-2 base file of the fp32
model (transformers), costs on the first --cost-windows windows at six types, and at the size of
each mix (Q3_K_M, Q4_K_M) a recipe built; then the recipe and the mix compared by llama.cpp on
the held-out windows (every window after the cost windows), paired by `kldtool diff`: the
recipe's own `--proof MIX`.

Prints per mix: its size and the recipe's, both KLDs on the held-out windows, the paired
difference with its interval; the recipe's predicted and measured KLD on the cost windows and
the additive prediction's error; the costs' time and forwards. Appends a dated row to
benchmarks/RESULTS.md. The ratio is the mix's held-out KLD over the recipe's (above 1: the
recipe is better). A recipe that does not beat a mix is reported as such.

    .venv/bin/python benchmarks/recipe_frontier.py [--work DIR] [-c 128] [--windows 48] [--cost-windows 8]
"""

from __future__ import annotations

import argparse
import json

from recipe_work import arguments, base_file, kldtool
from results import append_row

TYPES = "Q4_0,Q5_0,Q8_0,Q3_K,Q4_K,Q6_K"
MIXES = ("Q3_K_M", "Q4_K_M")


def main() -> None:
    a = arguments(argparse.ArgumentParser()).parse_args()
    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    src, base = default_gguf(), base_file(a)
    cache = a.work / "costs-cache.jsonl"
    rows, figures, ratios, mixes = [], [], [], []
    for mix in MIXES:
        mix_gguf = a.work / f"{mix}.gguf"  # its size is the recipe's target; recipe --proof builds its own
        if not mix_gguf.exists():
            quantize(src, str(mix_gguf), mix)
        size = mix_gguf.stat().st_size
        out = a.work / f"recipe-{mix}"
        kldtool("recipe", src, "--kl-divergence-base", base, "--types", TYPES, "--size", size, "-o", out,
                "--cost-windows", a.cost_windows, "--cost-cache", cache, "--proof", mix,
                "--progress", "none")  # fmt: skip
        r = json.loads((out / "recipe.json").read_text())
        proof = r["proof"]
        m, kr = proof["mixes"][0], proof["recipe"]["kld"]
        low, high = m["interval_95"]
        row = (f"{mix} {m['bytes']:,} B vs recipe {r['size']:,} B: held-out KLD {m['kld']:.5f} vs {kr:.5f}, "
               f"recipe - mix {m['recipe_minus_mix']:+.5f} [{low:+.5f}, {high:+.5f}] ({m['recipe_is']}); "
               f"cost windows predicted {r['predicted_kld']:.5f} measured {r['measured_kld']:.5f}, additive "
               f"{100 * r['additive_prediction_error']:.1f} % off, {len(r['rounds'])} round(s)")  # fmt: skip
        print(row)
        figures.append(row)
        ratios.append(f"{mix}: {m['kld'] / kr:.3f}")
        rows.append(r)
        mixes += r["mixes_on_cost_windows"]
    from kldtool.recipe.outputs import plot

    last = a.work / f"recipe-{MIXES[-1]}"
    points = json.loads((last / "frontier.json").read_text())["frontier"]
    built = [{"size": r["size"], "measured": r["measured_kld"]} for r in rows]
    plot(points, built, mixes, str(a.work / "frontier.png"))
    print(
        f"plot: {a.work / 'frontier.png'} (cost windows, transformers' forward: the frontier, the recipes, the mixes)"
    )
    took = rows[0]["costs_took"]
    if took["candidates"]:
        figures.append(
            f"costs: {took['candidates']} candidates, {took['forwards']} forwards in {took['seconds']:.0f} s"
        )
    else:
        figures.append("costs read from an earlier run's cost cache (--work)")
    append_row(
        f"recipe_frontier (SmolLM2 Q4_1 source, fp32 base, c{a.c} x {a.windows}, costs on {a.cost_windows} windows, "
        f"types {TYPES}; proof by llama.cpp on windows {a.cost_windows}-{a.windows - 1})",
        "; ".join(figures),
        "mix KLD / recipe KLD held out: " + ", ".join(ratios),
    )


if __name__ == "__main__":
    main()
