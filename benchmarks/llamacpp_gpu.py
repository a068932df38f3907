"""kldtool's llama.cpp engine on a GPU against llama-perplexity on the same GPU: the same build of
llama.cpp (scripts/build_cuda_llamacpp.sh: the libraries kldtool loads and llama-perplexity links),
the same base model, quants, base file and offload flags, in one run.

1. The base: llama-perplexity writes its base file with ``-ngl N``, kldtool writes one with the
   same flags in llama.cpp's raw layout; they must be byte-identical.
2. Each quant: ``llama-perplexity --kl-divergence`` and ``kldtool compare`` against that file,
   alternating, ``--rounds`` times each; every line of llama-perplexity's chunk table and of its
   three statistic blocks must be printed identically, and their best times give the ratio.

    python benchmarks/llamacpp_gpu.py --peer BIN --base-model F16.gguf --quant Q8_0.gguf --quant Q4_K_M.gguf \\
        --text wiki.test.txt [--ctx 512] [--chunks 100] [--ngl 99] [--rounds 2] [--results FILE]
    python benchmarks/llamacpp_gpu.py --dry-run [--results FILE]

``--dry-run`` (CI, no GPU) checks the same path on this machine's CPU build: kldtool's compare of
the Q8_0 requant with ``-ngl 99 -sm row -mg 0 -ts 3,1 -nkvo`` against llama-perplexity's own
printout of that compare in ../shared's fixtures (identical lines, the offload warning printed
once); it skips, saying why, where ../shared is absent.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from llamacpp_peer import timed
from results import append_row
from timing import alternating, median_ratio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.printout import chunk_table_lines, final_block_lines  # noqa: E402

SHARED = Path(os.environ.get("KLDTOOL_SHARED", ROOT.parent / "shared"))
KLDTOOL = [sys.executable, "-m", "kldtool"]


def blocks(text: str) -> list[str]:
    """llama-perplexity's chunk table and its three statistic blocks, as printed."""
    return chunk_table_lines(text) + final_block_lines(text)


def differing(ours: str, theirs: str) -> list[str]:
    a, b = blocks(ours), blocks(theirs)
    out = [f"ours:   {x}\ntheirs: {y}" for x, y in zip(a, b) if x != y]
    return out + ([f"{len(a)} lines printed, llama-perplexity {len(b)}"] if len(a) != len(b) else [])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def gpu_run(a) -> None:
    work = Path(tempfile.mkdtemp(prefix="llamacpp-gpu-"))
    offload = ["-ngl", a.ngl]
    scope = ["-c", a.ctx, "--chunks", a.chunks, "-b", a.batch]
    theirs_base, ours_base = work / "base-peer.kld", work / "base-kldtool.kld"
    t_theirs, _ = timed([a.peer, "-m", a.base_model, "-f", a.text, *scope, *offload,
                         "--kl-divergence-base", theirs_base])  # fmt: skip
    t_ours, _ = timed([*KLDTOOL, "base", "-m", a.base_model, "-f", a.text, *scope, *offload, "--format", "llamacpp",
                       "--kl-divergence-base", ours_base])  # fmt: skip
    same_base = sha256(theirs_base) == sha256(ours_base)
    print(f"base: kldtool {t_ours:.2f} s, llama-perplexity {t_theirs:.2f} s; files identical: {same_base}", flush=True)
    rows, failures = [], [] if same_base else ["base files differ"]
    for quant in a.quant:
        common = ["-m", quant, "--kl-divergence-base", theirs_base, *offload, "-b", a.batch]
        timed([*KLDTOOL, "compare", *common, "--chunks", 1])  # numba's reducer compiled and cached, untimed
        outputs: dict[str, str] = {}
        runs = {
            "llama-perplexity": lambda: outputs.__setitem__("theirs", timed([a.peer, *common, "--kl-divergence"])[1]),
            "kldtool": lambda: outputs.__setitem__("ours", timed([*KLDTOOL, "compare", *common])[1]),
        }
        times = alternating(runs, a.rounds)
        diff = differing(outputs["ours"], outputs["theirs"])
        failures += [f"{Path(quant).name}: {d}" for d in diff]
        ours, theirs = min(times["kldtool"]), min(times["llama-perplexity"])
        paired = median_ratio(times, "kldtool", "llama-perplexity")
        rows.append((Path(quant).stem, ours, theirs, paired, not diff))
        print(f"{Path(quant).stem}: kldtool {ours:.2f} s, llama-perplexity {theirs:.2f} s, ratio {ours / theirs:.3f} "
              f"(rounds' median {paired:.3f}); printed lines identical: {not diff}", flush=True)  # fmt: skip
    device = os.environ.get("KLDTOOL_GPU_NAME", "GPU")
    append_row(
        f"compare --engine llamacpp -ngl {a.ngl} vs llama-perplexity --kl-divergence -ngl {a.ngl}, one CUDA build "
        f"({Path(a.base_model).name} base, c={a.ctx}, {a.chunks} chunks, best of {a.rounds})",
        f"base {t_ours:.2f} s vs {t_theirs:.2f} s, files identical: {same_base}; "
        + "; ".join(
            f"{n} {o:.2f} s vs {t:.2f} s (median {p:.3f}), lines identical: {same}" for n, o, t, p, same in rows
        ),
        f"worst ratio {max(o / t for _, o, t, _, _ in rows):.3f}",
        where=device,
        path=a.results,
    )
    if failures:
        raise SystemExit("llamacpp_gpu: not identical to llama-perplexity:\n" + "\n".join(failures[:20]))


def dry_run(a) -> None:
    fixtures = SHARED / "fixtures" / "llamacpp"
    if not (fixtures / "compare-Q8_0.txt").exists():
        print(f"llamacpp_gpu --dry-run: skipped: no llama.cpp fixtures in {fixtures} (KLDTOOL_SHARED)")
        return
    import zstandard

    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    work = Path(tempfile.mkdtemp(prefix="llamacpp-gpu-dry-"))
    base, quant = work / "base.kld", work / "requant-Q8_0.gguf"
    with open(fixtures / "base-q4_1-c128.kld.zst", "rb") as src, open(base, "wb") as dst:
        zstandard.ZstdDecompressor().copy_stream(src, dst)
    quantize(default_gguf(), str(quant), "Q8_0")
    flags = ["-ngl", 99, "-sm", "row", "-mg", 0, "-ts", "3,1", "-nkvo"]
    t, out = timed([*KLDTOOL, "compare", "-m", quant, "--kl-divergence-base", base, *flags])
    theirs = (fixtures / "compare-Q8_0.txt").read_text()
    diff = differing(out, theirs)
    warnings = out.count("warning: this llama.cpp build has no GPU")
    append_row(
        "compare --engine llamacpp -ngl 99 on a CPU build vs llama-perplexity's printout (--dry-run)",
        f"Q8_0 requant, fixture base, {t:.2f} s; printed lines identical: {not diff}; offload warnings: {warnings}",
        "-",
        path=a.results,
    )
    if diff or warnings != 1:
        raise SystemExit("llamacpp_gpu --dry-run: " + ("\n".join(diff[:20]) or f"{warnings} offload warnings, not 1"))
    print("llamacpp_gpu --dry-run: -ngl 99 on the CPU build prints llama-perplexity's lines, one warning")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", help="llama-perplexity, built with the libraries kldtool loads")
    ap.add_argument("--base-model", help="the unquantized GGUF")
    ap.add_argument("--quant", action="append", default=[], help="a quant of it (repeat)")
    ap.add_argument("--text", help="the corpus")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--ngl", default="99")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true", help="CI: the CPU build against llama-perplexity's printout")
    a = ap.parse_args()
    if a.dry_run:
        dry_run(a)
    elif not (a.peer and a.base_model and a.quant and a.text):
        ap.error("give --peer, --base-model, --quant and --text (or --dry-run)")
    else:
        gpu_run(a)


if __name__ == "__main__":
    main()
