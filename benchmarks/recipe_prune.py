"""What does `recipe --prune` save, and what does it give up? The built-in SmolLM2 (its Q4_1
GGUF the source), the WikiText-2 base file of recipe_work.py, costs on the first --cost-windows
windows at six types. In one run: every candidate measured into a fresh cost cache (the peer),
then `--prune` into another fresh cache, each solved at the sizes of Q3_K_M and Q4_K_M (the
second size reuses its cache's measurements). Prints the forwards and the cost phases' seconds
of both (the ratio), whether the pruned recipe chose the same types, and its chosen candidates'
summed measured cost against the exhaustive optimum's (from the exhaustive cache). Appends a
dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/recipe_prune.py [--work DIR] [-c 128] [--windows 48] [--cost-windows 8]
"""

from __future__ import annotations

import argparse
import json

from recipe_work import arguments, base_file, kldtool
from results import append_row

TYPES = "Q4_0,Q5_0,Q8_0,Q3_K,Q4_K,Q6_K"
MIXES = ("Q3_K_M", "Q4_K_M")


def _costs(path) -> dict:
    """(tensor, sha256) -> the measured KLD above the base, from a cost cache."""
    out = {}
    for line in path.read_text().splitlines()[1:]:
        r = json.loads(line)["record"]
        if "above_base" in r:
            out[(r["tensor"], r["sha256"])] = max(0.0, r["above_base"])
    return out


def _summed(out_dir, truth: dict) -> float:
    """The recipe's chosen candidates' summed cost, each as the exhaustive cache measured it."""
    rows = json.loads((out_dir / "costs.json").read_text())["costs"]
    types = json.loads((out_dir / "recipe.json").read_text())["types"]
    picked = {(x["tensor"], x["sha256"]) for x in rows if types[x["tensor"]] == x["written"]}
    return sum(truth[x] for x in picked)


def main() -> None:
    a = arguments(argparse.ArgumentParser()).parse_args()
    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    src, base = default_gguf(), base_file(a)
    runs: dict[str, list[dict]] = {"exhaustive": [], "pruned": []}
    for kind in runs:
        cache = a.work / f"costs-{kind}.jsonl"
        cache.unlink(missing_ok=True)
        for mix in MIXES:
            mix_gguf = a.work / f"{mix}.gguf"
            if not mix_gguf.exists():
                quantize(src, str(mix_gguf), mix)
            out = a.work / f"{kind}-{mix}"
            kldtool("recipe", src, "--kl-divergence-base", base, "--types", TYPES, "--size", mix_gguf.stat().st_size,
                    "-o", out, "--cost-windows", a.cost_windows, "--cost-cache", cache, "--progress", "none",
                    *(["--prune"] if kind == "pruned" else []))  # fmt: skip
            r = json.loads((out / "recipe.json").read_text())
            r["out"] = out
            runs[kind].append(r)
    took = {k: [r["costs_took"] for r in v] for k, v in runs.items()}
    forwards = {k: sum(t["forwards"] for t in v) for k, v in took.items()}
    seconds = {k: sum(t["seconds"] for t in v) for k, v in took.items()}
    truth = _costs(a.work / "costs-exhaustive.jsonl")
    figures = [
        f"forwards: exhaustive {forwards['exhaustive']}, pruned {forwards['pruned']}; cost phases "
        f"{seconds['exhaustive']:.0f} s vs {seconds['pruned']:.0f} s"
    ]
    for mix, full, pruned in zip(MIXES, runs["exhaustive"], runs["pruned"]):
        same = full["types"] == pruned["types"]
        moved = sum(full["types"][t] != pruned["types"][t] for t in full["types"])
        best, ours = _summed(full["out"], truth), _summed(pruned["out"], truth)
        figures.append(
            f"at {mix}'s size: {'the same types' if same else f'{moved} tensors typed otherwise'}; summed "
            f"measured cost {ours:.6f} vs the optimum's {best:.6f} ({100 * (ours - best) / best:+.2f} %); measured "
            f"KLD {pruned['measured_kld']:.5f} vs {full['measured_kld']:.5f}"
        )
    for f in figures:
        print(f)
    append_row(
        f"recipe_prune (SmolLM2 Q4_1 source, fp32 base, c{a.c}, costs on {a.cost_windows} windows, types {TYPES}, "
        f"at the sizes of {', '.join(MIXES)})",
        "; ".join(figures),
        f"exhaustive / pruned: forwards {forwards['exhaustive'] / max(forwards['pruned'], 1):.2f}x, "
        f"cost seconds {seconds['exhaustive'] / max(seconds['pruned'], 1e-9):.2f}x",
    )


if __name__ == "__main__":
    main()
