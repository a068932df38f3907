"""Top-K base files (issue 7): size against llama.cpp's raw file, and how close their KLD comes
to the full rows' over a quant sweep.

One base run of the built-in Q4_1 GGUF over wikitext-2 is stored twice, in llama.cpp's raw
layout and as ``--keep top-K`` (same codec, so the kept codes are the raw file's). Each quant
(requantized from the Q4_1 with llama-cpp-python) is compared against both. Prints, per
quant, the exact (full-row) mean KLD, the top-K lower bound, the tail-corrected estimate and
the bound, whether the exact value lies in [lower, lower + bound], and the bound as a share
of the KLD; appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/compact_base.py [--ctx 512] [--chunks 20] [--keep 256] [--types Q8_0,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from base_fixture import ROOT, WIKI, kldtool
from results import append_row

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "compact"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--keep", type=int, default=256)
    ap.add_argument("--types", default="Q8_0,Q6_K,Q4_K_M,Q3_K_M,Q2_K")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kldtool.engines.defaults import default_gguf

    CACHE.mkdir(parents=True, exist_ok=True)
    src = default_gguf()
    full = CACHE / f"full-c{a.ctx}-{a.chunks}.kld"
    top = CACHE / f"top{a.keep}-c{a.ctx}-{a.chunks}.kldt"
    common = ("base", "-m", src, "-f", WIKI, "-c", a.ctx, "--chunks", a.chunks, "--codec", "llamacpp")
    if not full.exists():
        kldtool(*common, "--format", "llamacpp", "--kl-divergence-base", full)
    if not top.exists():
        kldtool(*common, "--keep", f"top-{a.keep}", "--kl-divergence-base", top)
    size_ratio = full.stat().st_size / top.stat().st_size
    print(
        f"raw {full.stat().st_size / 2**20:.1f} MiB, top-{a.keep} {top.stat().st_size / 2**20:.2f} MiB: "
        f"{size_ratio:.1f}x smaller"
    )
    rows, inside = [], 0
    for t in a.types.split(","):
        quant = CACHE / f"{t}.gguf"
        if not quant.exists():
            kldtool("quantize", src, quant, t)
        got = {}
        for name, path in (("full", full), ("top", top)):
            out = CACHE / f"{t}-{name}.json"
            kldtool("compare", "--kl-divergence-base", path, "-m", quant, "--json", out)
            got[name] = json.loads(out.read_text())["statistics"]
        exact = got["full"]["kld_mean"]["value"]
        c = got["top"]["compact_base"]
        lo, hi = c["kld_mean_lower_bound"], c["kld_mean_lower_bound"] + c["bound"]
        ok = lo <= exact <= hi
        inside += ok
        line = (
            f"{t}: exact {exact:.6f}, lower {lo:.6f} ({100 * (exact - lo) / exact:.1f} % below), "
            f"estimate {c['kld_mean_estimate']:.6f} ({100 * (c['kld_mean_estimate'] - exact) / exact:+.2f} %), "
            f"bound {c['bound']:.6f} = {100 * c['bound'] / exact:.1f} % of the KLD, inside: {ok}"
        )
        print(line)
        rows.append(
            f"{t} {exact:.5f} in [{lo:.5f}, {hi:.5f}] est {100 * (c['kld_mean_estimate'] - exact) / exact:+.1f} %"
        )
    append_row(
        f"compact_base (top-{a.keep}, c{a.ctx} x {a.chunks}, SmolLM2 Q4_1 base)",
        f"{'; '.join(rows)}; exact inside {inside}/{len(rows)}",
        f"raw / top-{a.keep} = {size_ratio:.1f}x",
    )


if __name__ == "__main__":
    main()
