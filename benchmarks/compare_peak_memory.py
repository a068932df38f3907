"""Peak RSS of `kldtool compare` for 8, 32 and 128 chunks: it must stay flat.

Writes three base files with the llamacpp engine (built-in SmolLM2 Q4_1), runs `compare` on each
in a fresh process and reads that process's own peak RSS from wait4(). Prints the table and the
ratio of the largest to the smallest peak, and appends a dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/compare_peak_memory.py [--ctx 128] [--batch 1024] [--chunks 8,32,128] [--text FILE]

The batch (tokens per engine call) is chosen so that every chunk count fills whole passes
(1024 / 128 = 8 chunks a pass): a run shorter than one pass would measure smaller buffers,
not a smaller dependence on the chunk count.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import append_row

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.test.txt"


def run_usage(args: list[str], env: dict | None = None):
    """(resource usage, wall seconds) of one kldtool process and the children it waited for
    (wait4: vLLM's engine process among them), run with ``env`` added to the environment."""
    t0 = time.time()
    p = subprocess.Popen(
        [sys.executable, "-m", "kldtool", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | (env or {}),
    )
    err = p.stderr.read().decode()  # before waiting: a child blocked on a full pipe never ends
    _, status, usage = os.wait4(p.pid, 0)
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kldtool {' '.join(args)} failed:\n{err}")
    return usage, time.time() - t0


def run_measured(args: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one kldtool process."""
    usage, wall = run_usage(args)
    return usage.ru_maxrss / 1024, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--chunks", default="8,32,128")
    ap.add_argument("--text", default=str(WIKI) if WIKI.exists() else None)
    a = ap.parse_args()
    counts = [int(x) for x in a.chunks.split(",")]
    text_args = ["-f", a.text] if a.text else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            base = os.path.join(tmp, f"base-{n}.kldt")
            batch = ["-b", str(a.batch)]
            run_measured(
                ["base", *text_args, *batch, "-c", str(a.ctx), "--chunks", str(n), "--kl-divergence-base", base]
            )
            rss, wall = run_measured(["compare", *batch, "--kl-divergence-base", base])
            rows.append((n, rss, wall))
            print(f"chunks {n:4d}: compare peak RSS {rss:8.1f} MiB, {wall:6.1f} s", flush=True)
    ratio = max(r[1] for r in rows) / min(r[1] for r in rows)
    print(f"peak RSS ratio, {counts[-1]} vs {counts[0]} chunks: {ratio:.3f} (target: flat, <= 1.10)")
    append_row(
        f"compare peak RSS (llamacpp, SmolLM2 Q4_1, c={a.ctx}, b={a.batch})",
        ", ".join(f"{n} chunks {rss:.0f} MiB" for n, rss, _ in rows),
        f"ratio {ratio:.3f}",
    )


if __name__ == "__main__":
    main()
