"""Peak RSS of `kldtool ppl`, or of `base` + `compare`, on one long window (2k, 8k, 16k tokens).

A window longer than -b tokens is evaluated in blocks through the model's KV cache, so the
logits held at once are O(block x vocab), not O(window x vocab) (16k x 49,152 float32 logits
alone are 3 GiB). Each run is a fresh process on the built-in SmolLM2 (transformers, fp32, one
exl3 window of L tokens); its own peak RSS comes from wait4(). Windows beyond SmolLM2's 8k
training context run with --force: this measures memory, not quality. Prints the table, the
16k/2k ratio for both modes and what the logits alone would take, and appends a dated row to
benchmarks/RESULTS.md.

With ``--phase compare`` each length writes a base file (kldtool's container, one window) and
compares the same model against it, block-wise: the peaks of both processes, beside the size
of the window's uint16 base rows, which the reader holds whole (one frame per window).

    .venv/bin/python benchmarks/long_window_memory.py [--lengths 2048,8192,16384] [--block 512] [--whole 2048]
    .venv/bin/python benchmarks/long_window_memory.py --phase compare
"""

from __future__ import annotations

import argparse

import os
import tempfile

from compare_peak_memory import WIKI, run_measured
from results import append_row

VOCAB = 49152


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--whole", default="2048", help="lengths also run as one whole window (-b = L)")
    ap.add_argument("--text", default=str(WIKI))
    ap.add_argument("--phase", choices=("ppl", "compare"), default="ppl")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.phase == "compare":
        return compare_phase(a, lengths)
    whole = [int(x) for x in a.whole.split(",") if x]
    rows = {}
    for mode, ls in (("block", lengths), ("whole", whole)):
        for n in ls:
            b = a.block if mode == "block" else n
            rss, wall = run_measured(["ppl", "--engine", "transformers", "-f", a.text, "--protocol", "exl3", "-c", str(n),
                                      "--stride", str(n), "--chunks", "1", "-b", str(b), "--force"])
            rows[mode, n] = rss
            print(f"{mode:5s} L={n:6d} (-b {b:6d}): peak RSS {rss:8.1f} MiB, {wall:6.1f} s; "
                  f"window x vocab float32 logits alone: {n * VOCAB * 4 / 2**20:8.1f} MiB", flush=True)
    lo, hi = lengths[0], lengths[-1]
    ratio = rows["block", hi] / rows["block", lo]
    print(f"block-wise peak RSS ratio, {hi} vs {lo} tokens: {ratio:.2f} (window grows {hi / lo:.0f}x; "
          f"the logits alone would grow by {(hi - lo) * VOCAB * 4 / 2**20:.0f} MiB)")
    if ("whole", whole[-1]) in rows if whole else False:
        print(f"whole-window peak RSS at {whole[-1]}: {rows['whole', whole[-1]]:.0f} MiB vs block-wise "
              f"{rows['block', whole[-1]]:.0f} MiB")
    figures = ", ".join(f"{m} {n // 1024}k {rss:.0f} MiB" for (m, n), rss in rows.items())
    append_row(f"ppl peak RSS, one long window (transformers fp32 SmolLM2, block {a.block})", figures,
               f"block-wise {hi // 1024}k/{lo // 1024}k {ratio:.2f}")


def compare_phase(a, lengths: list[int]) -> None:
    window = ["--engine", "transformers", "-f", a.text, "--protocol", "exl3", "--chunks", "1", "-b", str(a.block),
              "--force"]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            base = os.path.join(tmp, f"base-{n}.kldt")
            rss_b, wall_b = run_measured(["base", *window, "-c", str(n), "--stride", str(n),
                                          "--kl-divergence-base", base])
            rss_c, wall_c = run_measured(["compare", "--engine", "transformers", "-b", str(a.block), "--force",
                                          "--kl-divergence-base", base])
            rows[n] = (rss_b, rss_c)
            print(f"L={n:6d} (-b {a.block}): base peak RSS {rss_b:8.1f} MiB ({wall_b:5.1f} s), compare "
                  f"{rss_c:8.1f} MiB ({wall_c:5.1f} s); the window's uint16 base rows: "
                  f"{n * (VOCAB + 4) * 2 / 2**20:7.1f} MiB", flush=True)
    lo, hi = lengths[0], lengths[-1]
    ratio = rows[hi][1] / rows[lo][1]
    print(f"compare peak RSS ratio, {hi} vs {lo} tokens: {ratio:.2f}")
    append_row(f"base + compare peak RSS, one long window (transformers fp32 SmolLM2, block {a.block})",
               ", ".join(f"{n // 1024}k base {b:.0f} MiB / compare {c:.0f} MiB" for n, (b, c) in rows.items()),
               f"compare {hi // 1024}k/{lo // 1024}k {ratio:.2f}")


if __name__ == "__main__":
    main()
