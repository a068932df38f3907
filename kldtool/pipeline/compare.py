"""Phase 2: run a (quantized) model over a base file's tokens and stream llama.cpp's KLD statistics."""

from __future__ import annotations

import time

from kldtool.engines.base import Engine
from kldtool.errors import MismatchError
from kldtool.logitsfile.prefetch import PrefetchedChunks
from kldtool.pipeline.common import Sinks, groups, run_metadata, write_json
from kldtool.protocols import llamacpp_windows
from kldtool.report.console import TABLE_HEADER, chunk_line, final_blocks
from kldtool.stats import KldAccumulator, summarize
from kldtool.stats.summary import MIN_TOKENS_FOR_STATS


def check_compatible(engine: Engine, reader, force: bool) -> list[str]:
    """Refuse a model that does not belong to the base file; returns warnings that --force kept."""
    h, meta, where = reader.header, reader.metadata, reader.path
    if engine.n_vocab != h.n_vocab:
        raise MismatchError(f"{where}: base file has a vocabulary of {h.n_vocab}, the model {engine.n_vocab}")
    warnings = []
    stored = meta.get("tokenizer_identity")
    if stored is not None and stored != engine.tokenizer_identity():
        msg = (f"{where}: tokenizer differs from the base model's (identity {stored[:19]}... vs "
               f"{engine.tokenizer_identity()[:19]}...)")
        if not force:
            raise MismatchError(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    stored_bos = meta.get("protocol", {}).get("bos_id", engine.bos_id)
    if stored_bos != engine.bos_id:
        msg = (f"{where}: the base model {'replaced each chunk start by BOS ' + str(stored_bos) if stored_bos is not None else 'used no BOS'}"
               f", this model {'wants BOS ' + str(engine.bos_id) if engine.bos_id is not None else 'wants none'}")
        if not force:
            raise MismatchError(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    return warnings


def run_compare(engine: Engine, reader, force: bool = False, json_path: str | None = None,
                sinks: Sinks | None = None) -> dict:
    sinks = sinks or Sinks()
    t0 = time.time()
    warnings = check_compatible(engine, reader, force)
    for w in warnings:
        sinks.info("warning: " + w)
    h = reader.header
    n_seq = engine.windows_per_call(h.n_ctx)
    windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
    sinks.info(f"compare: {h.n_chunk} chunks, n_ctx={h.n_ctx}, n_seq={n_seq}, engine {engine.name}, "
               f"base {reader.path} ({reader.format_name})")
    acc = KldAccumulator()
    source = PrefetchedChunks(reader, range(h.n_chunk))
    try:
        for gi, group in enumerate(groups(windows, n_seq)):
            t_pass = time.time()
            records = engine.score(group, source)
            if gi == 0:
                per_pass = time.time() - t_pass
                sinks.info(f"compare: {per_pass:.2f} seconds per pass - ETA "
                           f"{per_pass * h.n_chunk / n_seq / 60:.2f} minutes")
                sinks.line()
                sinks.line(TABLE_HEADER)
            for w, rec in zip(group, records):
                acc.add(rec)
                sinks.line(chunk_line(w.index + 1, summarize(acc, with_quantiles=False)))
    finally:
        source.close()
    sinks.line()
    summary = summarize(acc, with_quantiles=acc.count >= MIN_TOKENS_FOR_STATS)
    if acc.count >= MIN_TOKENS_FOR_STATS:
        for line in final_blocks(summary):
            sinks.line(line)
    else:
        sinks.info(f"compare: only {acc.count} tokens scored (< {MIN_TOKENS_FOR_STATS}); no final statistics, as llama.cpp")
    result = run_metadata("compare") | {
        "protocol": reader.metadata.get("protocol", {"name": "llamacpp", "n_ctx": h.n_ctx}),
        "n_ctx": h.n_ctx,
        "chunks": h.n_chunk,
        "scored_tokens": acc.count,
        "base_file": {"path": reader.path, "format": reader.format_name, "n_vocab": h.n_vocab,
                      "metadata": reader.metadata},
        "model": engine.describe(),
        "tokenizer_identity": {"model": engine.tokenizer_identity(),
                               "base": reader.metadata.get("tokenizer_identity")},
        "warnings": warnings,
        "wall_time_s": round(time.time() - t0, 3),
        "statistics": summary.as_dict(),
    }
    if json_path:
        write_json(json_path, result)
    return result
