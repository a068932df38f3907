"""llama.cpp's decode of a raw base file's chunks and nothing else: the same batches, context
and threads as llama-perplexity --kl-divergence (kldtool's llama.cpp engine lays them out as it
does, bit-identical logits), no base rows read, no statistics. Its wall time, start-up and model
load included, is the least any tool that runs this decode can take: llamacpp_peer.py times it
beside both tools to show how much of each run is the shared decode.

    .venv/bin/python benchmarks/llamacpp_decode.py QUANT.gguf BASE.kld [-t THREADS] [-b BATCH]
"""

from __future__ import annotations

import argparse

import numpy as np

from kldtool.engines.llamacpp import LlamaCppEngine
from kldtool.protocols import llamacpp_windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("base", help="a base file in llama.cpp's raw layout")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-b", "--batch", type=int, default=2048)
    a = ap.parse_args()
    head = np.fromfile(a.base, dtype=np.int32, count=5)
    n_ctx, n_chunk = int(head[2]), int(head[4])
    tokens = np.fromfile(a.base, dtype=np.int32, count=n_ctx * n_chunk, offset=20)
    engine = LlamaCppEngine(a.model, threads=a.threads, batch_tokens=a.batch)
    windows = llamacpp_windows(tokens, n_ctx, n_chunk, engine.bos_id)
    per = engine.windows_per_call(n_ctx)
    rows = 0
    for i in range(0, n_chunk, per):
        rows += sum(len(b) for b in engine.logits(windows[i:i + per]))
    engine.close()
    print(f"decoded {n_chunk} chunks of {n_ctx}, {rows} scored rows")


if __name__ == "__main__":
    main()
