"""How fast base rows come out of a base file, per format and prefetch threads: the feed a GPU
compare needs (an 8B model on an H100 scores ~30k tokens/s, i.e. ~4 GB/s of rows at a
128k vocabulary), measured against the raw layout's plain read of the same rows.

Writes a synthetic base file of each format (random logits through the codec, the vocabulary
and chunk size given), then times ``iter_chunks`` over all chunks with 1, 2, 4 and 8 threads,
and the host-to-device copy of the rows when a GPU is there. (``compare`` picks its own
threads: half the cores, 2 to 8; see ``logitsfile/prefetch.py``.)

    python benchmarks/base_read_throughput.py [--vocab 128256] [--ctx 2048] [--chunks 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import append_row, machine  # noqa: E402

from kldtool.codec import encode_np  # noqa: E402
from kldtool.logitsfile import create_writer, iter_chunks, open_base_file  # noqa: E402
from kldtool.logitsfile.header import BaseHeader  # noqa: E402


def write_synthetic(path: str, fmt: str, header: BaseHeader, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, header.n_vocab, header.n_tokens).astype(np.int32)
    w = create_writer(path, fmt, header, tokens, {"synthetic": True})
    for _ in range(header.n_chunk):
        # Logit spread like a real model's: a few nats between likely tokens, a long tail.
        logits = rng.standard_normal((header.rows_per_chunk, header.n_vocab), dtype=np.float32) * 2.5
        w.write_chunk(encode_np(logits, "grid")[0])
    w.finish()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--results", default=None)
    a = ap.parse_args()

    header = BaseHeader(n_ctx=a.ctx, n_vocab=a.vocab, n_chunk=a.chunks)
    rows_bytes = a.chunks * header.chunk_nbytes
    figures = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for fmt in ("llamacpp", "kldtool"):
            path = os.path.join(tmp, f"base-{fmt}")
            write_synthetic(path, fmt, header)
            size = os.path.getsize(path)
            reader = open_base_file(path)
            for threads in (int(t) for t in a.threads.split(",")):
                for _ in iter_chunks(reader, range(a.chunks), ahead=2 * threads, threads=threads):
                    pass  # warm the page cache (and the first-call paths)
                t0 = time.perf_counter()
                for _ in iter_chunks(reader, range(a.chunks), ahead=2 * threads, threads=threads):
                    pass
                dt = time.perf_counter() - t0
                figures[(fmt, threads)] = rows_bytes / dt
                print(
                    f"{fmt:>8}, {threads} threads: {rows_bytes / dt / 1e9:6.2f} GB/s of rows "
                    f"({size / 2**20:.0f} MiB file, {dt:.2f} s)",
                    flush=True,
                )
            reader.close()
    try:
        import torch

        if torch.cuda.is_available():
            rows = np.zeros((header.rows_per_chunk, header.row_width), np.uint16)
            t = torch.from_numpy(rows.view(np.int16))
            t.to("cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                t.to("cuda")
            torch.cuda.synchronize()
            print(
                f"host-to-device copy of a chunk's rows (pageable): {5 * rows.nbytes / (time.perf_counter() - t0) / 1e9:.2f} GB/s"
            )
    except ImportError:
        pass
    best = {fmt: max(v for (f, _), v in figures.items() if f == fmt) for fmt in ("llamacpp", "kldtool")}
    append_row(
        f"base rows read (synthetic, vocab {a.vocab}, c={a.ctx}, {a.chunks} chunks), GB/s of rows by threads",
        "; ".join(f"{f} {t}t {v / 1e9:.2f}" for (f, t), v in figures.items()),
        f"container / raw {best['kldtool'] / best['llamacpp']:.3f}",
        machine(),
        a.results,
    )


if __name__ == "__main__":
    main()
