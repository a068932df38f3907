"""Peak RSS and time of `kldtool ppl` on an xLSTM helibrunna run at 1,024 to 16,384 tokens per song.

The run is tests/helpers/helibrunna_run.py's (random xLSTMLMModel, 64-d, 4 blocks, context 256,
written as a CUDA training run saves it); the corpus is REMIGEN2-like songs, three of them
longer than 16,384 tokens. Each length is a fresh process (`--protocol documents --lengths N`);
its own peak RSS comes from wait4(). Past the model's context every song runs through xlstm's
recurrent step() with the state carried, block by block (-b), so the peak must not grow with
N: the target is 16k/1k <= 1.2. Prints the table and the ratio, and appends a dated row to
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/xlstm_lengths.py [--lengths 1024,5120,10240,16384] [--songs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from compare_peak_memory import run_measured
from results import append_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
import helibrunna_run as hb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,5120,10240,16384")
    ap.add_argument("--songs", type=int, default=3, help="songs of 20,000 tokens (plus 4 shorter ones)")
    ap.add_argument("--block", type=int, default=2048, help="-b: tokens per step() call")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = hb.make_run(Path(tmp) / "run")
        songs = hb.write_songs(Path(tmp) / "songs.txt", [50, 700, 3000, 9000] + [20000] * a.songs)
        for n in lengths:
            out = os.path.join(tmp, f"r{n}.json")
            args = ["ppl", "-m", str(run), "-f", str(songs), "--protocol", "documents", "--lengths", str(n)]
            rss, wall = run_measured(args + ["-b", str(a.block), "--json", out])
            r = json.loads(Path(out).read_text())["per_length"][0]
            rows[n] = (rss, wall, r["perplexity"], r["total_tokens"])
            print(
                f"N={n:6d}: peak RSS {rss:7.1f} MiB, {wall:6.1f} s, PPL {r['perplexity']:.4f} ({r['total_tokens']} tokens)"
            )
    lo, hi = lengths[0], lengths[-1]
    ratio = rows[hi][0] / rows[lo][0]
    print(f"peak RSS {hi}/{lo}: {ratio:.3f} (target <= 1.2)")
    append_row(
        f"xlstm engine, helibrunna run (64-d, 4 blocks, context 256), {a.songs} songs past 16k, -b {a.block}",
        ", ".join(f"{n} tokens {rows[n][0]:.0f} MiB / {rows[n][1]:.0f} s" for n in lengths),
        f"peak RSS {hi}/{lo} {ratio:.2f}",
    )


if __name__ == "__main__":
    main()
