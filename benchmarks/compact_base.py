"""Top-K base files (issue 7) and reference packs (issue 84): size against llama.cpp's raw file,
and how close their KLD comes to the full rows' over a quant sweep.

One base run of the built-in Q4_1 GGUF over wikitext-2 is stored twice, in llama.cpp's raw
layout and as ``--keep top-K`` (same codec, so the kept codes are the raw file's); the raw file
is also packed (``kldtool pack --keep top-K``: its rows made top-K from the stored codes). Each
quant (requantized from the Q4_1 with llama-cpp-python) is compared against all three. Prints,
per quant and per top-K form, the exact (full-row) mean KLD, the lower bound, the
tail-corrected estimate and the interval, whether the exact value lies in it, and how many
windows' own exact KLD lies outside their own interval; appends a dated row to
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/compact_base.py [--ctx 512] [--chunks 20] [--keep 256] [--types Q8_0,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from base_fixture import ROOT, WIKI, kldtool
from results import append_row

CACHE = Path(os.environ.get("KLDTOOL_BENCH_DIR", Path.home() / ".cache" / "kldtool" / "compact"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--keep", type=int, default=256)
    ap.add_argument("--types", default="Q8_0,Q6_K,Q4_K_M,Q3_K_M,Q2_K")
    ap.add_argument(
        "--base-type", help="the base model: the built-in GGUF requantized to this type (F32: its fp32 form)"
    )
    ap.add_argument("--card", help="also write report --card of the quants' full-row runs here")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kldtool.engines.defaults import default_gguf

    CACHE.mkdir(parents=True, exist_ok=True)
    src = default_gguf()
    base_model, tag = src, ""
    if a.base_type:
        base_model, tag = CACHE / f"{a.base_type}.gguf", f"{a.base_type}-"
        if not base_model.exists():
            kldtool("quantize", src, base_model, a.base_type)
    full = CACHE / f"{tag}full-c{a.ctx}-{a.chunks}.kld"
    top = CACHE / f"{tag}top{a.keep}-c{a.ctx}-{a.chunks}.kldt"
    common = ("base", "-m", base_model, "-f", WIKI, "-c", a.ctx, "--chunks", a.chunks, "--codec", "llamacpp")
    if not full.exists():
        kldtool(*common, "--format", "llamacpp", "--kl-divergence-base", full)
    if not top.exists():
        kldtool(*common, "--keep", f"top-{a.keep}", "--kl-divergence-base", top)
    pack = CACHE / f"{tag}pack{a.keep}-c{a.ctx}-{a.chunks}"
    if not pack.exists():
        kldtool("pack", full, "-o", pack, "--keep", f"top-{a.keep}")
    packed = sum(f.stat().st_size for f in pack.iterdir())
    size_ratio = full.stat().st_size / top.stat().st_size
    print(
        f"raw {full.stat().st_size / 2**20:.1f} MiB, top-{a.keep} {top.stat().st_size / 2**20:.2f} MiB: "
        f"{size_ratio:.1f}x smaller; the pack {packed / 2**20:.2f} MiB: {full.stat().st_size / packed:.1f}x"
    )
    rows, inside, cases = [], 0, 0
    for t in a.types.split(","):
        quant = CACHE / f"{t}.gguf"
        if not quant.exists():
            kldtool("quantize", src, quant, t)
        got = {}
        for name, path in (("full", full), ("top", top), ("pack", pack)):
            out = CACHE / f"{tag}{t}-{name}.json"
            kldtool("compare", "--kl-divergence-base", path, "-m", quant, "--json", out)
            got[name] = json.loads(out.read_text())
        exact = got["full"]["statistics"]["kld_mean"]["value"]
        for form in ("top", "pack"):
            c = got[form]["statistics"]["compact_base"]
            lo, hi = c["kld_mean_lower_bound"], c["kld_mean_lower_bound"] + c["bound"]
            ok = lo <= exact <= hi
            inside, cases = inside + ok, cases + 1
            missed = window_misses(got["full"]["chunk_sums"], got[form]["chunk_sums"], c["allowance"])
            print(
                f"{t} {form}: exact {exact:.6f}, lower {lo:.6f} ({100 * (exact - lo) / exact:.1f} % below), "
                f"estimate {c['kld_mean_estimate']:.6f} ({100 * (c['kld_mean_estimate'] - exact) / exact:+.2f} %), "
                f"interval up to {hi:.6f}, inside: {ok}; hidden / tail estimate "
                f"{(exact - lo) / c['tail_estimate']:.3f}; windows outside theirs: {missed}/{a.chunks}"
            )
            rows.append(
                f"{t} {form} {exact:.5f} in [{lo:.5f}, {hi:.5f}] "
                f"est {100 * (c['kld_mean_estimate'] - exact) / exact:+.1f} %, windows out {missed}/{a.chunks}"
            )
    if a.card:
        kldtool("report", *(CACHE / f"{tag}{t}-full.json" for t in a.types.split(",")), "--card", a.card)
    append_row(
        f"compact_base (top-{a.keep}, c{a.ctx} x {a.chunks}, SmolLM2 {a.base_type or 'Q4_1'} base; top = base --keep, pack = pack of the raw file)",
        f"{'; '.join(rows)}; exact inside {inside}/{cases}",
        f"raw / top-{a.keep} = {size_ratio:.1f}x, raw / pack = {full.stat().st_size / packed:.1f}x",
    )


def window_misses(full: dict, top: dict, allowance: float) -> int:
    """Windows whose own full-row mean KLD lies outside their own [lower, lower + allowance x tail]."""

    def column(table, name):
        return np.array([v[table["columns"].index(name)] for v in table["vectors"]])

    assert full["chunks"] == top["chunks"]
    n = column(top, "count")
    exact, lo = column(full, "kld") / n, column(top, "kld") / n
    hi = lo + allowance * column(top, "kld_tail") / n
    return int(((exact < lo) | (exact > hi)).sum())


if __name__ == "__main__":
    main()
