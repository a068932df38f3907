"""Phase 1: run the base model over a corpus, print its perplexity like llama-perplexity, and
optionally store every scored position's log-probabilities in a base file."""

from __future__ import annotations

import time

from kldtool.engines.base import Engine
from kldtool.logitsfile import BaseHeader, create_writer
from kldtool.pipeline.common import Sinks, groups, run_metadata
from kldtool.protocols import describe_llamacpp, llamacpp_chunk_count, llamacpp_windows
from kldtool.report.console import final_estimate, ppl_progress
from kldtool.stats import PplAccumulator


def default_codec(fmt: str) -> str:
    """llama.cpp's own rounding for its raw layout (byte-identical files); the exact-for-bf16
    power-of-two grid for kldtool's container (see codec.py)."""
    return "llamacpp" if fmt == "llamacpp" else "grid"


def run_base(engine: Engine, corpus_name: str, text: bytes, n_ctx: int, chunks: int | None,
             out_path: str | None, fmt: str = "kldtool", sinks: Sinks | None = None, codec: str | None = None) -> dict:
    sinks = sinks or Sinks()
    codec = codec or default_codec(fmt)
    t0 = time.time()
    tokens = engine.tokenize(text)
    n_chunk = llamacpp_chunk_count(len(tokens), n_ctx, chunks)
    windows = llamacpp_windows(tokens, n_ctx, n_chunk, engine.bos_id)
    header = BaseHeader(n_ctx, engine.n_vocab, n_chunk)
    n_seq = engine.windows_per_call(n_ctx)
    sinks.info(f"base: {n_chunk} chunks of {n_ctx} tokens ({len(tokens)} tokens in {corpus_name}), "
               f"{n_seq} per pass, engine {engine.name}")
    protocol = describe_llamacpp(n_ctx) | {"bos_id": engine.bos_id}
    metadata = run_metadata("base") | {
        "protocol": protocol,
        "corpus": corpus_name,
        "model": engine.describe(),
        "tokenizer_identity": engine.tokenizer_identity(),
        "n_vocab": engine.n_vocab,
        "codec": codec,
    }
    writer = create_writer(out_path, fmt, header, tokens[:header.n_tokens], metadata) if out_path else None
    ppl = PplAccumulator()
    try:
        for group in groups(windows, n_seq):
            for w, (rows, nll) in zip(group, engine.encode(group, codec)):
                if writer:
                    writer.write_chunk(rows)
                ppl.add(nll)
                sinks.out(ppl_progress(w.index + 1, ppl.ppl))
        sinks.line()
        value, unc = ppl.estimate()
        sinks.info(final_estimate(value, unc))
        result = {"ppl": value, "ppl_uncertainty": unc, "scored_tokens": ppl.count, "chunks": n_chunk,
                  "wall_time_s": round(time.time() - t0, 3)}
        if writer:
            writer.finish({"result": result})
            sinks.info(f"base: wrote {out_path} ({writer.format_name} format)")
    except BaseException:
        if writer:
            writer.abort()
        raise
    return result
