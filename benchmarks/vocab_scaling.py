"""What kldtool costs as the vocabulary grows, through transformers on the CPU: the built-in
SmolLM2 (49,152) and random-weight models of Llama 3 (128,256), Qwen 2 (151,936, tied), Qwen 3
at Qwen 3.5's vocabulary (248,320) and Gemma 3 (262,144, soft-capped), built by
tests/helpers/vocab_models.py. For each vocabulary, in one process:

- bytes per scored token of each stored form: container rows, llama.cpp's raw layout, top-32
  records, hidden states (the head counted once, not per token);
- compare against the bare forward of the same engine (the model, one log-softmax, the targets'
  log-probs to the host), timed in alternating rounds: the time ratio, minor page faults per
  scored row and system time of each (getrusage around each run, after a warm-up round; the
  medians of the rounds, as single rounds swing widely), under
  the CLI's allocation policy (kldtool/runtime/memory.py), and compare again under the mmap policy it
  replaced;
- the host reducer's nanoseconds per vocabulary entry (numba, one core, rows of random logits);
- the host decoding of container rows, in GB of uint16 rows per second on one core.

With ``--peak`` it also runs ``kldtool base`` and ``compare`` as processes at c = 2048 and 8192
(one window) and prints their peak RSS beside the block x vocabulary model of it.

    .venv/bin/python benchmarks/vocab_scaling.py [--ctx 512] [--chunks 4] [--rounds 2] [--peak]
    .venv/bin/python benchmarks/vocab_scaling.py --plot docs/img/vocab_scaling.png   # from the last run

Each run also writes its figures to benchmarks/vocab_scaling.json, which ``--plot`` draws.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from results import append_row  # noqa: E402
from kldtool.runtime.memory import set_malloc_policy  # noqa: E402
from transformers_overhead import bare_scoring  # noqa: E402

LAST = ROOT / "benchmarks" / "vocab_scaling.json"
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"
SIMPLE = ["smollm2", "llama3", "qwen2", "qwen3.5-vocab", "gemma3"]


def model_and_corpus(name: str):
    """(model directory, corpus path, corpus format) for a vocabulary's model."""
    if name == "smollm2":
        from kldtool.engines.defaults import default_transformers_model

        return default_transformers_model(), str(WIKI), "auto"
    from helpers.vocab_models import corpus_flags, model_dir

    flags = corpus_flags(name)
    return str(model_dir(name)), str(flags[1]), flags[3] if len(flags) > 2 else "auto"


def usage() -> tuple[int, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime


def measured(fn, rounds: int) -> dict:
    """Best wall time of ``fn`` over ``rounds`` (after one warm-up), and the median of the
    rounds' minor faults and system seconds, with the faults' range: a round's faults swing
    from none to hundreds of thousands as torch's threads and the heap's top happen to land
    (the bare forward's too), so one round's count says little."""
    fn()
    times, faults, sys_s = [], [], []
    for _ in range(rounds):
        f0, s0 = usage()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        f1, s1 = usage()
        faults.append(f1 - f0)
        sys_s.append(s1 - s0)
    return {
        "s": min(times),
        "faults": statistics.median(faults),
        "faults_range": [min(faults), max(faults)],
        "sys": statistics.median(sys_s),
    }


def reducer_ns_per_entry(vocab: int, rows: int = 64) -> float:
    import numpy as np

    from kldtool.reduce.numba_cpu import reduce_rows_cpu

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((rows, vocab), dtype=np.float32)
    base = rng.integers(0, 65535, (rows, vocab), dtype=np.uint16)
    targets = rng.integers(0, vocab, rows).astype(np.int64)
    reduce_rows_cpu(logits, base, targets, -16.0)  # compiled and warm
    t0 = time.perf_counter()
    for _ in range(3):
        reduce_rows_cpu(logits, base, targets, -16.0)
    return (time.perf_counter() - t0) / 3 / (rows * vocab) * 1e9


def decode_gbps(reader) -> float:
    """uint16 rows rebuilt from the container's frames on this thread, GB per second."""
    n = reader.frames.n_frames
    for k in range(n):  # read once: the file in the page cache, the timing then on decoding
        reader.read_frame(k)
    t0 = time.perf_counter()
    nbytes = sum(reader.read_frame_rows(k).nbytes for k in range(n))
    return nbytes / (time.perf_counter() - t0) / 1e9


def one_vocabulary(name: str, a, tmp: str) -> dict:

    from kldtool.text.corpus import open_corpus
    from kldtool.engines.transformers.engine import TransformersEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.sinks import Sinks
    from kldtool.pipeline.base_job import BaseJob
    from kldtool.pipeline.write_base import run_base
    from kldtool.text.protocols import Protocol, llamacpp_windows

    model, text, fmt = model_and_corpus(name)
    engine = TransformersEngine(model)
    quiet = Sinks(out=lambda s: None, info=lambda s: None)
    corpus = open_corpus(text, fmt)
    sizes = {}
    for label, fname, opts in (
        ("container", "rows.kldt", {}),
        ("raw", "rows.kld", {}),
        ("top32", "top.kldt", {"keep": 32}),
        ("hidden", "hidden.kldt", {"store": "hidden"}),
    ):
        path = os.path.join(tmp, f"{name}-{fname}")
        layout = "llamacpp" if label == "raw" else "kldtool"
        run_base(
            engine,
            corpus,
            BaseJob(
                protocol=Protocol(name="llamacpp", n_ctx=a.ctx), out_path=path, chunks=a.chunks, fmt=layout, **opts
            ),
            quiet,
        )
        reader = open_base_file(path)
        scored = reader.header.n_chunk * reader.header.rows_per_chunk
        head = (reader.metadata.get("head") or {}).get("length", 0)
        sizes[label] = (os.path.getsize(path) - head) / scored
        reader.close()
    reader = open_base_file(os.path.join(tmp, f"{name}-rows.kldt"))
    h = reader.header
    windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
    rows = h.n_chunk * h.rows_per_chunk
    # Under the CLI's allocation policy (kldtool/runtime/memory.py), and compare again under the
    # policy it replaced (every buffer of 1 MiB and more mapped afresh), in this one process.
    runs = {
        "bare": measured(lambda: bare_scoring(engine, windows, "cpu"), a.rounds),
        "compare": measured(lambda: run_compare(engine, reader, sinks=quiet), a.rounds),
    }
    set_malloc_policy("mmap")
    runs["compare_mmap"] = measured(lambda: run_compare(engine, reader, sinks=quiet), a.rounds)
    set_malloc_policy()
    out = {
        "vocab": h.n_vocab,
        "rows": rows,
        "bytes_per_token": sizes,
        "ratio": runs["compare"]["s"] / runs["bare"]["s"],
        "ratio_mmap": runs["compare_mmap"]["s"] / runs["bare"]["s"],
        "seconds": {k: v["s"] for k, v in runs.items()},
        "faults_per_row": {k: v["faults"] / rows for k, v in runs.items()},
        "faults_per_row_range": {k: [f / rows for f in v["faults_range"]] for k, v in runs.items()},
        "sys_s": {k: v["sys"] for k, v in runs.items()},
        "reducer_ns_per_entry": reducer_ns_per_entry(h.n_vocab),
        "decode_gbps": decode_gbps(reader),
    }
    reader.close()
    return out


def peak_rss(name: str, ctx: int, tmp: str) -> dict:
    """Peak RSS (MiB) of `kldtool base` and `compare` as processes over one window of ``ctx``."""
    model, text, fmt = model_and_corpus(name)
    base = os.path.join(tmp, f"{name}-{ctx}.kldt")
    out = {}
    for cmd in (
        ["base", "-m", model, "-f", text, "--corpus-format", fmt, "-c", str(ctx), "--chunks", "1"],
        ["compare", "-m", model],
    ):
        argv = [sys.executable, "-c", PEAK, *cmd, "--kl-divergence-base", base]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: rc {p.returncode}\n{p.stderr[-2000:]}")
        out[cmd[0]] = int(p.stdout.strip().splitlines()[-1]) / 1024
    return out


# The command run in a process of its own, its peak RSS (KiB) printed last: VmHWM, which starts
# afresh at exec (getrusage's ru_maxrss keeps the forking parent's peak across exec on Linux).
PEAK = (
    "import sys\n"
    "from kldtool.cli.app import _run\n"
    "rc = _run(sys.argv[1:])\n"
    "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    "sys.exit(rc)\n"
)


def plot(results: dict, path: str) -> None:
    """Per-entry cost, page faults per row and bytes per token against the vocabulary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = sorted(results.values(), key=lambda r: r["vocab"])
    v = [r["vocab"] / 1000 for r in rs]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    ax[0].plot(v, [r["reducer_ns_per_entry"] for r in rs], "o-", label="reducer (numba, 1 core)")
    ax[0].plot(v, [2 / r["decode_gbps"] for r in rs], "s-", label="container decode (1 core)")
    ax[0].set(title="host cost per vocabulary entry", ylabel="ns per entry", ylim=(0, None))
    for k, style in (("bare", "o--"), ("compare", "o-"), ("compare_mmap", "x:")):
        ax[1].plot(v, [r["faults_per_row"].get(k, float("nan")) for r in rs], style, label=k)
    ax[1].set(title="minor page faults per scored row", ylim=(0, None))
    for k in ("raw", "container", "hidden", "top32"):
        ax[2].plot(v, [r["bytes_per_token"][k] / 1024 for r in rs], "o-", label=k)
    ax[2].set(title="base file KiB per scored token", yscale="log")
    for a in ax:
        a.set_xlabel("vocabulary (thousands)")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle("kldtool through transformers fp32 on a 2-core CPU (benchmarks/vocab_scaling.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def _faults(r: dict, run: str) -> str:
    lo, hi = r["faults_per_row_range"][run]
    return f"{r['faults_per_row'][run]:.1f} [{lo:.1f}-{hi:.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", action="append", choices=SIMPLE, help="vocabularies to run (default: all)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peak", action="store_true", help="also peak RSS of base and compare at c=2048 and 8192")
    ap.add_argument("--results", default=None)
    ap.add_argument("--plot", default=None, help="draw the last run's figures (benchmarks/vocab_scaling.json) here")
    a = ap.parse_args()
    if a.plot:
        plot(json.loads(LAST.read_text())["results"], a.plot)
        return
    names = a.vocab or SIMPLE
    print(f"allocation policy: {set_malloc_policy()} (compare under the mmap policy it replaced: columns 'mmap')")
    print(
        f"{'vocab':>8} {'rows':>5} | bytes/token: {'container':>9} {'raw':>8} {'top32':>6} {'hidden':>6} | "
        f"compare/bare (mmap) | faults/row bare compare (mmap) | sys s bare compare (mmap) | reducer ns/entry | "
        "decode GB/s/core"
    )
    results = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for name in names:
            r = results[name] = one_vocabulary(name, a, tmp)
            b = r["bytes_per_token"]
            print(
                f"{r['vocab']:>8} {r['rows']:>5} | {'':13}{b['container']:>9.0f} {b['raw']:>8.0f} {b['top32']:>6.0f} "
                f"{b['hidden']:>6.0f} | {r['ratio']:>12.3f} ({r['ratio_mmap']:.3f}) | "
                f"{r['faults_per_row']['bare']:>10.0f} {r['faults_per_row']['compare']:>7.0f} "
                f"({r['faults_per_row']['compare_mmap']:.0f}) | {r['sys_s']['bare']:>6.2f} "
                f"{r['sys_s']['compare']:>7.2f} ({r['sys_s']['compare_mmap']:.2f}) | "
                f"{r['reducer_ns_per_entry']:>16.3f} | {r['decode_gbps']:>16.2f}",
                flush=True,
            )
        peaks = {}
        if a.peak:
            for name in (names[0], names[-1]):
                for ctx in (2048, 8192):
                    peaks[(name, ctx)] = p = peak_rss(name, ctx, tmp)
                    print(
                        f"peak RSS {name} ({results[name]['vocab']}) c={ctx}: base {p['base']:.0f} MiB, "
                        f"compare {p['compare']:.0f} MiB",
                        flush=True,
                    )
    figures = "; ".join(
        f"{r['vocab']}: {r['ratio']:.3f}x bare ({r['ratio_mmap']:.3f}x mmap policy), faults/row (median "
        f"[range] of {a.rounds} rounds) {_faults(r, 'compare')} vs {_faults(r, 'bare')} bare "
        f"({r['faults_per_row']['compare_mmap']:.0f} mmap policy), sys s {r['sys_s']['compare']:.2f} vs "
        f"{r['sys_s']['bare']:.2f} ({r['sys_s']['compare_mmap']:.2f}), {r['bytes_per_token']['container']:.0f}/"
        f"{r['bytes_per_token']['raw']:.0f}/{r['bytes_per_token']['top32']:.0f}/"
        f"{r['bytes_per_token']['hidden']:.0f} B/token (container/raw/top32/hidden), reducer "
        f"{r['reducer_ns_per_entry']:.2f} ns/entry, decode {r['decode_gbps']:.2f} GB/s"
        for r in results.values()
    )
    if peaks:
        figures += "; peak RSS MiB " + ", ".join(
            f"{results[n]['vocab']} c={c}: base {p['base']:.0f} compare {p['compare']:.0f}"
            for (n, c), p in peaks.items()
        )
    LAST.write_text(
        json.dumps(
            {
                "ctx": a.ctx,
                "chunks": a.chunks,
                "results": results,
                "peaks": {f"{n} c={c}": p for (n, c), p in peaks.items()},
            },
            indent=1,
        )
    )
    worst = max(r["ratio"] for r in results.values())
    append_row(
        f"vocab_scaling (transformers fp32, CPU, c={a.ctx}, {a.chunks} windows)",
        figures,
        f"compare/bare at most {worst:.3f}",
        path=a.results,
    )


if __name__ == "__main__":
    main()
