"""kldtool compare --engine llamacpp against llama-perplexity --kl-divergence itself: the same
GGUF quants, the same base file, the same chunks and threads, one machine, one run.

The peer is built here from the llama.cpp sources inside the llama-cpp-python sdist of the
installed version (fetched from the package registry) into a cache directory outside the
repository (``~/.cache/kldtool/peer`` or $KLDTOOL_PEER_DIR); nothing of it is committed. On
x86-64 it gets the instruction-set flags scripts/setup.sh builds llama-cpp-python with, so
both tools run the same kernels.
The base file is written once by kldtool in llama.cpp's raw layout from the built-in Q4_1
GGUF (byte-identical to what llama-perplexity writes, see tests/test_llamacpp_parity.py);
the quants are requantized from it with llama-cpp-python. Wall time includes loading the
model for both tools; each tool runs ``--rounds`` times per type in alternating order and its
best time counts (a 2-core VM varies by 20 % from one run to the next); beside the ratio of the
best times it prints the median of each round's ratio, which a drift of the machine's speed over
minutes moves far less (the two runs of a round see nearly the same machine). A third contender,
llamacpp_decode.py, runs the shared decode alone in llama-perplexity's layout (one context, all
threads; start-up and load included): its time over the peer's is the floor of any ratio a tool
running the decode that way can reach; kldtool's two contexts side by side go below it. Prints each tool's time,
their ratio and that floor, and appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/llamacpp_peer.py [--ctx 512] [--chunks 20] [--types Q8_0,Q4_K_M,Q2_K] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tarfile
import time
from importlib.metadata import version
from pathlib import Path

from results import append_row
from timing import alternating, median_ratio

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"
PEER_DIR = Path(os.environ.get("KLDTOOL_PEER_DIR", Path.home() / ".cache" / "kldtool" / "peer"))


def cmake_flags() -> list[str]:
    """The instruction-set flags llama-cpp-python was built with by scripts/setup.sh (x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    return (ROOT / "scripts" / "lib" / "llamacpp-cmake-args").read_text().split()


def build_peer() -> Path:
    """llama-perplexity from the llama-cpp-python sdist of the installed version (cached)."""
    ver = version("llama_cpp_python")
    src = PEER_DIR / f"llama_cpp_python-{ver}"
    flags = cmake_flags()
    build = src / ("build-portable" if flags else "build")
    binary = build / "bin" / "llama-perplexity"
    if binary.exists():
        return binary
    PEER_DIR.mkdir(parents=True, exist_ok=True)
    sdist = PEER_DIR / f"llama_cpp_python-{ver}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"llama-cpp-python=={ver}",
                "-d",
                str(PEER_DIR),
            ],
            check=True,
        )
    if not src.exists():
        with tarfile.open(sdist) as t:
            t.extractall(PEER_DIR, filter="data")
    llama = src / "vendor" / "llama.cpp"
    print(f"building llama-perplexity from {llama} (a few minutes)...", flush=True)
    subprocess.run(
        [
            "cmake",
            "-S",
            str(llama),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_OPENSSL=OFF",
            *(flags or ["-DGGML_NATIVE=ON"]),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-perplexity", "-j", str(os.cpu_count() or 2)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return binary


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return dt, p.stdout + p.stderr


def kld_mean(text: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Mean    KLD")), "?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--types", default="Q8_0,Q4_K_M,Q2_K")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each contender per type, order rotated; best taken")
    a = ap.parse_args()

    from kldtool.engines.defaults import default_gguf
    from kldtool.engines.llamacpp.quantize import quantize

    peer = build_peer()
    work = PEER_DIR / "bench"
    work.mkdir(exist_ok=True)
    model = default_gguf()
    base = work / f"base-c{a.ctx}-{a.chunks}.kld"
    if not base.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kldtool",
                "base",
                "-m",
                model,
                "-f",
                str(WIKI),
                "-c",
                str(a.ctx),
                "--chunks",
                str(a.chunks),
                "--format",
                "llamacpp",
                "--kl-divergence-base",
                str(base),
            ],
            check=True,
            capture_output=True,
        )
    common = ["--kl-divergence-base", base, "-t", a.threads, "-b", a.batch]
    rows = []
    for type_name in a.types.split(","):
        quant = work / f"q4_1-to-{type_name}.gguf"
        if not quant.exists():
            quantize(model, str(quant), type_name)
        cmd_theirs = [peer, "-m", quant, "--kl-divergence", "-c", a.ctx, *common]
        cmd_ours = [sys.executable, "-m", "kldtool", "compare", "--engine", "llamacpp", "-m", quant, *common]
        cmd_decode = [
            sys.executable,
            ROOT / "benchmarks" / "llamacpp_decode.py",
            quant,
            base,
            "-t",
            a.threads,
            "-b",
            a.batch,
        ]
        # An untimed chunk first: numba's compiled reducer reaches its disk cache (the first
        # run on a machine compiles it). llama-perplexity has no such cost to hide.
        timed(cmd_ours + ["--chunks", 1])
        outputs: dict[str, str] = {}

        def run(name, cmd):
            return lambda: outputs.__setitem__(name, timed(cmd)[1])

        times = alternating(
            {
                "llama-perplexity": run("theirs", cmd_theirs),
                "kldtool": run("ours", cmd_ours),
                "decode alone": run("decode", cmd_decode),
            },
            a.rounds,
        )
        theirs, ours, decode = (min(times[k]) for k in ("llama-perplexity", "kldtool", "decode alone"))
        paired = median_ratio(times, "kldtool", "llama-perplexity")
        out_theirs, out_ours = outputs["theirs"], outputs["ours"]
        rows.append((type_name, ours, theirs, decode, paired))
        print(
            f"{type_name:>6}: kldtool {ours:6.2f} s, llama-perplexity {theirs:6.2f} s, ratio {ours / theirs:.3f} "
            f"(median of the rounds' ratios {paired:.3f}); decode alone {decode:6.2f} s (floor "
            f"{decode / theirs:.3f}); mean KLD {kld_mean(out_ours)} vs {kld_mean(out_theirs)}",
            flush=True,
        )
    worst = max(o / t for _, o, t, _, _ in rows)
    worst_paired = max(p for *_, p in rows)
    floor = max(d / t for _, _, t, d, _ in rows)  # one context's decode alone: what a zero-cost reduction would give
    print(
        f"worst ratio kldtool / llama-perplexity: {worst:.3f} of the best times, {worst_paired:.3f} as the median "
        f"of each round's (target <= 0.95); the shared decode alone, worst type: {floor:.3f}"
    )
    append_row(
        f"compare --engine llamacpp vs llama-perplexity --kl-divergence, and the shared llama.cpp decode "
        f"alone (SmolLM2 Q4_1 base, c={a.ctx}, {a.chunks} chunks, -t {a.threads}, -b {a.batch}, "
        f"best of {a.rounds})",
        "; ".join(
            f"{t} {o:.2f} s vs {th:.2f} s (rounds' median ratio {p:.3f}), decode alone {d:.2f} s"
            for t, o, th, d, p in rows
        ),
        f"worst ratio {worst:.3f} (rounds' median {worst_paired:.3f}); decode floor {floor:.3f}",
    )


if __name__ == "__main__":
    main()
