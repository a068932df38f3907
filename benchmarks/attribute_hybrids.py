"""Is `kldtool attribute`'s ranking useful? Hybrids of the built-in SmolLM2's Q2_K requant that
keep N tensors at the Q8_0 requant's values: the attribution's top N, against N random tensors.

1. The fp32 SmolLM2 (the built-in Q4_1 dequantized) writes a base file of WikiText-2 windows
   (transformers, c = 512).
2. `kldtool attribute BASE Q2_K.gguf --granularity tensor --kld out` ranks every linear tensor by
   its leave-one-out gain on the first --windows windows.
3. For each N, in torch: the Q2_K weights (dequantized by transformers' GGUF loader) with the
   top N tensors set to their Q8_0 values, and --random hybrids that instead keep N random
   tensors of the same shapes (each top tensor swapped for a random other tensor of its shape,
   so the same number of parameters is kept); plus Q2_K alone and Q8_0 alone.
4. `kldtool compare` measures each model's mean KLD against the base file on windows the
   attribution never saw (--eval A:B).

The attribution's hybrid must have a lower mean KLD than every random one, for each N. Prints
the table and appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/attribute_hybrids.py [--windows 4] [--eval 8:48] [--n 5,20] [--random 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from results import append_row

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"


def kldtool(*args) -> None:
    p = subprocess.run([sys.executable, "-m", "kldtool", *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"kldtool {' '.join(map(str, args))} failed:\n{p.stderr[-3000:]}")


def quants(work: Path) -> dict[str, Path]:
    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    out = {}
    for t in ("Q2_K", "Q8_0"):
        out[t] = work / f"{t}.gguf"
        if not out[t].exists():
            quantize(default_gguf(), str(out[t]), t)
    return out


def dequantized(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).state_dict()


def save_hybrid(base_dir: str, state: dict, where: Path) -> Path:
    """A checkpoint directory of ``state`` in the base model's architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_dir), dtype=torch.float32)
    model.load_state_dict(state)
    model.save_pretrained(where)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(base_dir) / f, where / f)
    return where


def mean_kld(model_dir: Path, base: Path, span: str, out: Path) -> float:
    kldtool("compare", "--engine", "transformers", "-m", model_dir, "--kl-divergence-base", base,
            "--chunk-range", span, "--json", out)  # fmt: skip
    return json.loads(out.read_text())["statistics"]["kld_mean"]["value"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=4, help="windows the attribution runs on")
    ap.add_argument("--eval", default="8:48", help="the base file's windows the hybrids are compared on")
    ap.add_argument("--n", default="5,20")
    ap.add_argument("--random", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "kldtool" / "attribute"))
    a = ap.parse_args()
    from kldtool.engines.defaults import default_transformers_model

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    base_dir = default_transformers_model()
    q = quants(work)
    n_windows = int(a.eval.split(":")[1])
    base = work / f"base-c512-{n_windows}.kldt"
    if not base.exists():
        kldtool("base", "--engine", "transformers", "-m", base_dir, "-f", WIKI, "-c", 512, "--chunks", n_windows,
                "--kl-divergence-base", base)  # fmt: skip
    t0 = time.time()
    at = work / f"attribute-{a.windows}.json"
    if not at.exists():
        kldtool("attribute", base_dir, q["Q2_K"], "--kl-divergence-base", base, "--chunks", a.windows,
                "--granularity", "tensor", "--kld", "out", "--json", at)  # fmt: skip
    attribution_s = time.time() - t0
    ranked = [u["name"] for u in json.loads(at.read_text())["units"]]
    q2, q8 = dequantized(q["Q2_K"]), dequantized(q["Q8_0"])
    shape = {name: tuple(q2[name + ".weight"].shape) for name in ranked}
    rng = np.random.default_rng(a.seed)
    rows = [("Q2_K", 0, "-", None), ("Q8_0", 0, "-", None)]
    models = {
        "Q2_K": save_hybrid(base_dir, q2, work / "hyb-Q2_K"),
        "Q8_0": save_hybrid(base_dir, q8, work / "hyb-Q8_0"),
    }
    for n in (int(x) for x in a.n.split(",")):
        top = ranked[:n]
        sets = [("attribution", top)]
        for r in range(a.random):
            pool, chosen = [x for x in ranked if x not in top], []
            for name in top:  # a random other tensor of the same shape for each kept one
                same = [x for x in pool if shape[x] == shape[name] and x not in chosen]
                chosen.append(same[int(rng.integers(len(same)))])
            sets.append((f"random {r + 1}", chosen))
        for label, kept in sets:
            state = dict(q2)
            for name in kept:
                state[name + ".weight"] = q8[name + ".weight"]
            key = f"N{n}-{label.replace(' ', '')}"
            models[key] = save_hybrid(base_dir, state, work / f"hyb-{key}")
            rows.append((key, n, label, kept))
    results = {}
    for key, path in models.items():
        results[key] = mean_kld(path, base, a.eval, work / f"cmp-{key}.json")
        print(f"{key:22s} mean KLD {results[key]:.6f}", flush=True)
    ok = True
    lines = [f"Q2_K {results['Q2_K']:.6f}", f"Q8_0 {results['Q8_0']:.6f}"]
    for n in (int(x) for x in a.n.split(",")):
        mine = results[f"N{n}-attribution"]
        rand = [results[f"N{n}-random{r + 1}"] for r in range(a.random)]
        ok &= all(mine < x for x in rand)
        lines.append(f"N={n}: attribution {mine:.6f} vs random " + ", ".join(f"{x:.6f}" for x in rand))
        print(lines[-1])
    params = {n: sum(int(np.prod(shape[x])) for x in ranked[:n]) for n in (int(x) for x in a.n.split(","))}
    print(f"attribution's hybrid below every random one: {ok}; attribution took {attribution_s:.0f} s")
    append_row(
        f"attribute hybrids (SmolLM2 Q2_K, tensors kept at Q8_0; attribution on {a.windows} windows, "
        f"compare on windows {a.eval}, c=512)",
        "; ".join(lines) + f"; kept parameters {params}; attribution {attribution_s:.0f} s",
        f"attribution below all {a.random} random hybrids at every N: {ok}",
    )


if __name__ == "__main__":
    main()
