"""Phase 2: run a (quantized) model over a base file's tokens and stream llama.cpp's KLD statistics.

With ``state_path`` the accumulators are checkpointed atomically (every few chunks, on Ctrl-C
and at the end); ``resume`` continues from that checkpoint. Checkpoints fall on the engine's
batch boundaries, so a resumed run evaluates the same batches and prints the same numbers.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from kldtool import reduce
from kldtool.engines.base import Engine
from kldtool.errors import ContextTooLong, TokenizerMismatch, UsageError, VocabMismatch
from kldtool.identity import base_identity, model_identity
from kldtool.logitsfile import frame_facts
from kldtool.pipeline.common import Sinks, groups, run_metadata, whole_batches
from kldtool.pipeline.lanes import alone_at_the_end, in_order, lane_plan, lanes_note
from kldtool.pipeline.state import RunState, check_fits, load_state, save_state
from kldtool.manifest import run_manifest
from kldtool.protocols import Window, llamacpp_windows, parse_lengths, windows_from_table
from kldtool.report.console import TABLE_HEADER, chunk_line, extra_block, final_blocks
from kldtool.report.per_token import PerTokenWriter
from kldtool.sizes import model_size_dict
from kldtool.stats import KldAccumulator, summarize
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.report import statistics
from kldtool.stats.summary import MIN_TOKENS_FOR_STATS
from kldtool.textio import write_json


def check_compatible(engine: Engine, reader, force: bool) -> list[str]:
    """Refuse a model that does not belong to the base file; returns warnings that --force kept."""
    h, meta, where = reader.header, reader.metadata, reader.path
    if engine.n_vocab != h.n_vocab:
        raise VocabMismatch(f"{where}: base file has a vocabulary of {h.n_vocab}, the model {engine.n_vocab}")
    warnings = []
    n_train = engine.n_ctx_train
    if n_train and h.n_ctx > n_train:
        # as base and ppl: --force runs past the trained context (a memory or speed test)
        msg = f"{where}: chunks of {h.n_ctx} tokens exceed the model's context of {n_train}"
        if not force:
            raise ContextTooLong(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    stored = meta.get("tokenizer_identity")
    if stored is not None and stored != engine.tokenizer_identity():
        msg = (f"{where}: tokenizer differs from the base model's (identity {stored[:19]}... vs "
               f"{engine.tokenizer_identity()[:19]}...)")
        if not force:
            raise TokenizerMismatch(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    stored_bos = meta.get("protocol", {}).get("bos_id", engine.bos_id)
    if stored_bos != engine.bos_id:
        msg = (f"{where}: the base model {'replaced each chunk start by BOS ' + str(stored_bos) if stored_bos is not None else 'used no BOS'}"
               f", this model {'wants BOS ' + str(engine.bos_id) if engine.bos_id is not None else 'wants none'}")
        if not force:
            raise TokenizerMismatch(msg + "; --force compares anyway")
        warnings.append("FORCED: " + msg)
    return warnings


def base_windows(reader, bos_id: int | None) -> list[Window]:
    """The windows the base file was written with: llama.cpp's chunks (BOS substituted as
    this model wants), or the file's own window table."""
    h = reader.header
    if h.windows is None:
        return llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, bos_id)
    return windows_from_table(reader.tokens, h.windows)


def file_protocol(reader) -> dict:
    return reader.metadata.get("protocol") or {"name": "llamacpp", "n_ctx": reader.header.n_ctx}


def check_protocol_flags(reader, name: str | None, ctx_size: int | None, stride: int | None,
                         lengths: str | None) -> None:
    """compare takes the protocol from the base file; flags that say otherwise are refused."""
    stored = file_protocol(reader)
    given = {"--protocol": (name, stored.get("name")), "-c": (ctx_size, stored.get("n_ctx")),
             "--stride": (stride, stored.get("stride"))}
    if lengths is not None:
        given["--lengths"] = (tuple(parse_lengths(lengths)), tuple(stored.get("lengths", ())))
    for flag, (want, have) in given.items():
        if want is not None and want != have:
            shown = ",".join(map(str, have)) if isinstance(have, tuple) else have
            raise UsageError(f"{flag} {lengths if flag == '--lengths' else want} contradicts {reader.path}, written with "
                             f"{'no ' + flag if have in (None, ()) else flag + ' ' + str(shown)}"
                             f"{'' if flag == '--protocol' else ' (protocol ' + str(stored.get('name')) + ')'}; "
                             f"drop {flag}: compare takes the protocol from the base file")


def parse_chunk_range(spec: str | None, chunks: int | None, n_chunk: int, where: str) -> tuple[int, int]:
    """``--chunk-range A:B`` (0-based, end exclusive: chunks printed A+1..B) and ``--chunks N``."""
    if spec is not None and chunks is not None:
        raise UsageError("--chunks and --chunk-range contradict each other; give one")
    if chunks is not None:
        if chunks < 1:
            raise UsageError(f"--chunks {chunks}: must be at least 1")
        return 0, min(chunks, n_chunk)
    if spec is None:
        return 0, n_chunk
    a_s, sep, b_s = spec.partition(":")
    try:
        a = int(a_s) if a_s.strip() else 0
        b = int(b_s) if b_s.strip() else n_chunk
    except ValueError:
        a = b = -1
    if not sep or not 0 <= a < b or b > n_chunk:
        raise UsageError(f"--chunk-range {spec}: expected A:B with 0 <= A < B <= {n_chunk} (the chunks of {where})")
    return a, b


@dataclass
class Checkpoints:
    """Where and how often the accumulators are saved: every ``chunks`` chunks or ``seconds``."""

    path: str | None = None
    chunks: int | None = None
    seconds: float = 60.0
    resume: bool = False

    @classmethod
    def parse(cls, path: str | None, every: str | None, resume: bool) -> "Checkpoints":
        if resume and not path:
            raise UsageError("--resume needs --state FILE (the checkpoint to continue from)")
        if every is not None and not path:
            raise UsageError("--checkpoint-every needs --state FILE")
        spec = (every or "60s").strip()
        try:
            value = float(spec[:-1]) if spec.endswith("s") else int(spec)
        except ValueError:
            value = 0
        if value <= 0:
            raise UsageError(f"--checkpoint-every {every}: expected a number of chunks (10) or seconds (60s)")
        if spec.endswith("s"):
            return cls(path, None, value, resume)
        return cls(path, int(value), float("inf"), resume)


def replay(source: KldAccumulator, sinks: Sinks) -> KldAccumulator:
    """Add ``source``'s chunks again one by one, printing each running line as the run did."""
    acc = KldAccumulator()
    for chunk, vector, values in source.iter_chunks():
        acc.add_chunk(chunk, vector, values)
        sinks.line(chunk_line(chunk + 1, summarize(acc, with_quantiles=False)))
    return acc


def final_report(acc: KldAccumulator, sinks: Sinks, warnings: list[str], bootstrap: Bootstrap = Bootstrap(),
                 keep: int | None = None, floor: dict | None = None) -> dict:
    """llama.cpp's three statistic blocks, kldtool's extra block (and any --force warning
    again), returning the statistics."""
    sinks.line()
    summary, stats = statistics(acc, bootstrap, keep)
    if floor and acc.count:
        stats["noise_floor"] = floor | {"multiple": (summary.kld_mean[0] / floor["kld_mean"]
                                                     if floor["kld_mean"] > 0 else float("inf"))}
    if acc.count >= MIN_TOKENS_FOR_STATS:
        for line in final_blocks(summary) + extra_block(stats):
            sinks.line(line)
    else:
        sinks.info(f"compare: only {acc.count} tokens scored (< {MIN_TOKENS_FOR_STATS}); no final statistics, as llama.cpp")
    for w in warnings:
        sinks.line("warning: " + w)
    return stats


def _start_state(ck: Checkpoints, meta: dict, sinks: Sinks) -> RunState:
    fresh = RunState(meta, KldAccumulator())
    if not ck.resume:
        return fresh
    if not os.path.exists(ck.path):
        sinks.info(f"compare: no checkpoint at {ck.path} yet; starting from chunk {meta['chunk_range'][0] + 1}")
        return fresh
    state = load_state(ck.path)
    check_fits(state, ck.path, meta["base"], model_identity(meta["model"]), tuple(meta["chunk_range"]))
    if state.meta.get("n_seq") != meta["n_seq"]:
        sinks.info(f"compare: note: the checkpoint was made with {state.meta.get('n_seq')} chunks per pass, "
                   f"this run uses {meta['n_seq']}; batching can change the last digits")
    sinks.info(f"compare: resuming {ck.path} at chunk {state.next_chunk + 1}")
    return RunState(meta | {"resumed": state.meta.get("resumed", []) + [state.next_chunk]}, state.acc)


def run_compare(engine: Engine, reader, force: bool = False, json_path: str | None = None,
                sinks: Sinks | None = None, chunk_range: tuple[int, int] | None = None,
                checkpoints: Checkpoints | None = None, per_token_path: str | None = None,
                bootstrap: Bootstrap = Bootstrap(), floor: dict | None = None) -> dict:
    sinks = sinks or Sinks()
    ck = checkpoints or Checkpoints()
    t0 = time.time()
    warnings = check_compatible(engine, reader, force)
    for w in warnings:
        sinks.info("warning: " + w)
    h = reader.header
    a, b = chunk_range or (0, h.n_chunk)
    n_seq = engine.windows_per_call(h.n_ctx)
    described = engine.describe()
    meta = {"base": base_identity(reader), "base_path": reader.path, "model": described,
            "chunk_range": [a, b], "n_seq": n_seq, "warnings": warnings,
            "protocol": file_protocol(reader), "manifest": run_manifest(described, engine.tokenizer_identity())}
    state = _start_state(ck, meta, sinks)
    start = state.next_chunk
    in_range = base_windows(reader, engine.bos_id)[a:b]
    windows = in_range[start - a:]
    lanes, batches = lane_plan(engine, list(groups(windows, n_seq)))
    sinks.info(f"compare: chunks {start + 1}..{b} of {h.n_chunk}, n_ctx={h.n_ctx}, n_seq={n_seq}, "
               f"engine {engine.name}{lanes_note(lanes, batches)}, base {reader.path} ({reader.format_name})")
    hidden_floor = reader.metadata.get("replay")
    if hidden_floor:
        sinks.info(f"compare: the base file stores hidden states; its replay floor: mean KLD "
                   f"{hidden_floor['kld_mean']:.3g} (max {hidden_floor['kld_max']:.3g}, |Δlogit| up to "
                   f"{hidden_floor['max_abs_dlogit']:.3g})")
    sinks.line()
    sinks.line(TABLE_HEADER)
    acc = replay(state.acc, sinks)
    state.acc = acc
    per_token = None
    if per_token_path and not (state.complete and os.path.exists(per_token_path)):
        per_token = PerTokenWriter(per_token_path, meta, resume_tokens=acc.count)
    # numba's import holds the interpreter, which the checks above (the tokenizer's identity:
    # a loop over the vocabulary) and the lanes' way into their first decodes need: it starts
    # once those decodes are ready to go.
    warm = (lambda: reduce.warm_up(engine.device, len(lanes), tail=alone_at_the_end(lanes, batches))) \
        if engine.reduces_here else None
    scored = in_order(engine, lanes, batches, lambda lane, group, source: lane.score(group, source),
                      lambda chunks: engine.rows_source(reader, chunks), beside=warm)
    last_save, saved_at = time.time(), len(acc.chunks)

    def checkpoint() -> None:
        # Records reach the disk before the state: they must never hold fewer tokens than it.
        if per_token:
            per_token.flush()
        save_state(ck.path, state)

    t_pass = time.time()
    try:
        for gi, (group, records) in enumerate(scored):
            if gi == 0:  # the lanes' first passes run side by side
                per_pass = time.time() - t_pass
                sinks.info(f"compare: {per_pass:.2f} seconds per pass - ETA "
                           f"{per_pass * -(-len(batches) // len(lanes)) / 60:.2f} minutes")
            for w, rec in zip(group, records):
                # Records first: wherever Ctrl-C lands, they cover every chunk the accumulator
                # holds, and --resume cuts them back to the checkpoint.
                if per_token:
                    per_token.add(w.index, w.scored_positions(), w.targets, rec)
                acc.add(rec, w.index)
                sinks.line(chunk_line(w.index + 1, summarize(acc, with_quantiles=False)))
            due = (ck.chunks is not None and len(acc.chunks) - saved_at >= ck.chunks) or \
                  time.time() - last_save >= ck.seconds
            # Only where one of llama-perplexity's batches ends (lanes may take pieces of them):
            # a resumed run starts a batch there and evaluates the same batches.
            done = len(acc.chunks)
            if ck.path and due and not state.complete and whole_batches(in_range, n_seq, done) == done:
                checkpoint()
                last_save, saved_at = time.time(), len(acc.chunks)
    except BaseException:
        if ck.path:
            # Keep whole batches only: a resumed run must evaluate the same batches.
            acc.truncate(whole_batches(in_range, n_seq, len(acc.chunks)))
            if len(acc.chunks) > saved_at:
                checkpoint()
            sinks.info(f"compare: stopped after chunk {state.next_chunk}; checkpoint in {ck.path}, "
                       f"--resume continues it")
        if per_token:
            per_token.close(keep=bool(ck.path))
        raise
    finally:
        scored.close()  # waits for the lanes' decodes in progress
    if ck.path:
        checkpoint()
    result = run_metadata("compare") | {
        "protocol": meta["protocol"],
        "n_ctx": h.n_ctx,
        "chunks": b - a,
        "chunk_range": [a, b],
        "scored_tokens": acc.count,
        "base": meta["base"],
        "base_file": {"path": reader.path, "format": reader.format_name, "n_vocab": h.n_vocab,
                      **frame_facts(reader), "metadata": reader.metadata},
        "model": engine.describe(),
        "model_size": model_size_dict(meta["model"].get("model")),
        "tokenizer_identity": {"model": engine.tokenizer_identity(),
                               "base": reader.metadata.get("tokenizer_identity")},
        "manifest": meta["manifest"],
        "base_manifest": reader.metadata.get("manifest"),
        "state": ck.path,
        "resumed_at_chunks": state.meta.get("resumed", []),
        "warnings": warnings,
        "replay_floor": reader.metadata.get("replay"),
    }
    result["statistics"] = final_report(acc, sinks, warnings, bootstrap, h.keep, floor)
    result["chunk_sums"] = acc.chunk_table()
    result["wall_time_s"] = round(time.time() - t0, 3)
    if per_token:
        per_token.finish(result["statistics"])
        result["per_token"] = str(per_token.path)
    if json_path:
        write_json(json_path, result)
    return result
