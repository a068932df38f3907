"""Issue 40: an adaptive sweep (``kldtool sweep``) against the full sweep it replaces, in one run.

The built-in Q4_1 GGUF writes a base file over WikiText-2; six types requantized from it with
llama-cpp-python are each compared over every window (the full sweep, timed), then ranked by
``kldtool sweep`` in a fresh directory (timed). Checks: the same ranking, every quant's
full-corpus mean KLD inside its adaptive interval, and the time ratio (target <= 1/3). Then the
stopping rule's coverage is simulated on the full sweep's per-window sums
(``stopping_coverage.py``). Appends a row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/adaptive_sweep.py [--ctx 512] [--chunks 160] [--sims 400]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from base_fixture import gguf_sweep_inputs, kldtool
from results import append_row
from stopping_coverage import report_coverage

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "adaptive"))
TYPES = "Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0"


def timed(*args) -> float:
    t = time.perf_counter()
    kldtool(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=160)
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--sims", type=int, default=400)
    a = ap.parse_args()
    types = a.types.split(",")
    base, quants = gguf_sweep_inputs(CACHE, a.ctx, a.chunks, types)
    runs = CACHE / f"full-c{a.ctx}-{a.chunks}"  # kept: stopping_coverage.py can be rerun on them
    runs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full_s = 0.0
        full = {}
        for t, path in quants.items():
            out = runs / f"{t}.json"
            full_s += timed("compare", "--kl-divergence-base", base, "-m", path, "--json", out)
            full[t] = json.loads(out.read_text())
            print(f"full {t}: mean KLD {full[t]['statistics']['kld_mean']['value']:.6f}", flush=True)
        sweep_dir = Path(tmp) / "sweep"
        models = [x for p in quants.values() for x in ("-m", p)]
        adaptive_s = timed("sweep", "--kl-divergence-base", base, *models, "-o", sweep_dir)
        log = json.loads((sweep_dir / "sweep.json").read_text())
    truth = {t: r["statistics"]["kld_mean"]["value"] for t, r in full.items()}
    got = log["quants"]
    same_rank = sorted(truth, key=truth.get) == sorted(got, key=lambda t: got[t]["kld_mean"])
    inside = {t: got[t]["interval"][0] <= truth[t] <= got[t]["interval"][1] for t in types}
    used = sum(got[t]["windows"] for t in types)
    ratio = adaptive_s / full_s
    figures = [
        f"{t} {got[t]['windows']} windows {got[t]['kld_mean']:.5f} [{got[t]['interval'][0]:.5f}, "
        f"{got[t]['interval'][1]:.5f}] full {truth[t]:.5f}{'' if inside[t] else ' OUTSIDE'}"
        for t in sorted(types, key=truth.get)
    ]
    print("\n".join(figures))
    print(
        f"full sweep {full_s:.1f} s ({a.chunks * len(types)} windows), adaptive {adaptive_s:.1f} s ({used} windows): "
        f"ratio {ratio:.3f} (target <= 0.333); same ranking: {same_rank}; inside: {sum(inside.values())}/{len(types)}"
    )
    vectors = {t: np.asarray(r["chunk_sums"]["vectors"], np.float64) for t, r in full.items()}
    coverage = report_coverage(vectors, a.sims, log["first"])
    append_row(
        f"adaptive sweep vs full sweep (SmolLM2 Q4_1 base, c={a.ctx}, {a.chunks} windows, 6 GGUF types, llamacpp)",
        f"full {full_s:.1f} s, adaptive {adaptive_s:.1f} s ({used} of {a.chunks * len(types)} windows); "
        f"same ranking {same_rank}; full mean inside the adaptive interval {sum(inside.values())}/{len(types)}; "
        + "; ".join(figures)
        + f"; {coverage}",
        f"time ratio {ratio:.3f} (target <= 0.333)",
    )


if __name__ == "__main__":
    main()
