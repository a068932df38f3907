"""llama.cpp's decode of a raw base file's chunks and nothing else: the same batches, context
and threads as llama-perplexity --kl-divergence (kldtool's llama.cpp engine lays them out as it
does, bit-identical logits; the windows compare takes from the base file), no base rows read, no
statistics, in one context with all the threads, as llama-perplexity runs it. Its wall time,
start-up and model load included, is the least a tool running the decode in that layout can
take: llamacpp_peer.py times it beside both tools to show how much of each run is the decode.
kldtool's compare decodes the same batches in two 1-thread contexts side by side (--contexts),
which gets more out of two cores than one 2-thread context, and so can finish below it.

    .venv/bin/python benchmarks/llamacpp_decode.py QUANT.gguf BASE.kld [-t THREADS] [-b BATCH]
"""

from __future__ import annotations

import argparse

from kldtool.engines.llamacpp.engine import LlamaCppEngine
from kldtool.logitsfile import open_base_file
from kldtool.pipeline.compat import base_windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("base", help="the base file whose chunks to decode (either layout; its rows are not read)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-b", "--batch", type=int, default=2048)
    a = ap.parse_args()
    reader = open_base_file(a.base)
    engine = LlamaCppEngine(a.model, threads=a.threads, batch_tokens=a.batch, contexts=1)
    windows = base_windows(reader, engine.bos_id)  # the windows compare evaluates
    per = engine.windows_per_call(reader.header.n_ctx)
    rows = 0
    for i in range(0, len(windows), per):
        rows += sum(len(b) for b in engine.logits(windows[i : i + per]))
    engine.close()
    reader.close()
    print(f"decoded {len(windows)} chunks of {reader.header.n_ctx}, {rows} scored rows")


if __name__ == "__main__":
    main()
