"""Phase 1: run the base model over a corpus, print its perplexity like llama-perplexity, and
optionally store every scored position's log-probabilities in a base file.

The file is written beside its target under a hidden partial name; an interrupted run leaves
that partial (and its journal of per-chunk NLL) for ``resume``, which continues after the
last whole batch of chunks, so the finished file equals an uninterrupted run's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from kldtool.codec import DEFAULT_CLAMP, Coding
from kldtool.corpus import Corpus
from kldtool.engines.base import Engine
from kldtool.errors import ReplayMismatch, UsageError
from kldtool.identity import model_identity
from kldtool.logitsfile import BaseHeader, create_writer
from kldtool.pipeline.sinks import Sinks
from kldtool.progress import Progress
from kldtool.pipeline.batching import groups, whole_batches
from kldtool.manifest import run_metadata
from kldtool.pipeline.hidden_base import DEFAULT_TOLERANCE, HiddenStore, check_store
from kldtool.pipeline.plan import Plan, make_plan
from kldtool.pipeline.routing_base import base_routing, routed_blocks
from kldtool.manifest import run_manifest
from kldtool.protocols import Protocol, window_table
from kldtool.report.console import final_estimate, ppl_progress
from kldtool.stats import PplAccumulator


def default_codec(fmt: str) -> str:
    """llama.cpp's own rounding for its raw layout (byte-identical files); the exact-for-bf16
    power-of-two grid for kldtool's container (see codec/rows.py)."""
    return "llamacpp" if fmt == "llamacpp" else "grid"


def plan_header(plan: Plan, n_vocab: int, coding: Coding) -> BaseHeader:
    """llama.cpp's uniform chunks keep its header; other protocols carry their window table."""
    if plan.protocol.name == "llamacpp":
        return BaseHeader(plan.protocol.n_ctx, n_vocab, len(plan.windows), keep=coding.keep, clamp=coding.clamp)
    return BaseHeader(
        plan.n_ctx, n_vocab, len(plan.windows), window_table(plan.windows), len(plan.stream), coding.keep, coding.clamp
    )


def _open_writer(out_path, fmt, header, tokens, metadata, settings, windows, n_seq, resume, sinks, ppl):
    writer = create_writer(
        out_path, fmt, header, tokens, metadata, settings, resume=resume, frame_rows=settings["frame_rows"]
    )
    if not resume:
        if writer.found_stale:
            sinks.info(
                f"base: note: replaced an interrupted earlier run's partial file {writer.out.tmp_path} "
                f"(--resume would have continued it)"
            )
        return writer, 0
    try:
        records = writer.recover(settings)
        records = records[: whole_batches(windows, n_seq, len(records))]  # same batches: same logits
        writer.keep(records, settings)
    except BaseException:
        writer.abort(keep=True)
        raise
    if records:
        sinks.info(f"base: resuming {writer.out.tmp_path} after chunk {len(records)}")
    else:
        sinks.info(f"base: nothing to resume for {out_path}; starting from chunk 1")
    for k, nll in enumerate(records):
        ppl.add(nll)
        sinks.out(ppl_progress(k + 1, ppl.ppl))
    return writer, len(records)


def _written(blocks, writer):
    """Each window's NLL once its rows are written; the rows go to the file block by block."""
    current, parts = 0, []
    for i, rows, nll in blocks:
        if i != current:
            yield _end_window(writer, parts)
            current, parts = i, []
        if writer:
            writer.write_rows(rows)
        parts.append(nll)
    if parts:
        yield _end_window(writer, parts)


def _end_window(writer, parts: list) -> np.ndarray:
    nll = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if writer:
        writer.end_chunk(nll)
    return nll


@dataclass
class BaseSetup:
    """What a base run decides before its first window: the windows, the file's header, the
    metadata and the settings a resumed or joined run must match, and the batch size."""

    plan: Plan
    header: BaseHeader
    metadata: dict
    settings: dict
    n_seq: int
    coding: Coding
    sections: tuple = ()  # stored after the rows (routing/section.py)


def setup_base(engine, corpus, protocol, chunks, fmt, codec, keep, clamp, frame_rows, force, hidden=None, head=None):
    """The run's plan and everything the file records of it (the same on every node that
    builds it from the same engine, text and flags: cluster/base_shards.py relies on that)."""
    coding = Coding(codec, clamp, keep)
    plan = make_plan(engine, corpus, protocol, chunks, force)
    if keep and keep > engine.n_vocab:
        raise UsageError(f"--keep top-{keep}: the vocabulary has only {engine.n_vocab} entries")
    header = plan_header(plan, engine.n_vocab, coding)
    n_seq = engine.windows_per_call(plan.n_ctx)
    described = plan.describe(engine.bos_id)
    model = engine.describe()
    metadata = (
        run_metadata("base")
        | {
            "protocol": described,
            "corpus": corpus.name,
            "model": model,
            "tokenizer_identity": engine.tokenizer_identity(),
            "manifest": run_manifest(model, engine.tokenizer_identity()),
            "n_vocab": engine.n_vocab,
            "codec": codec,
            "n_seq": n_seq,
        }
        | (hidden.metadata if hidden else {})
    )
    settings = {
        "format": fmt,
        "codec": codec,
        "keep": keep,
        "clamp": clamp,
        "frame_rows": frame_rows,
        **({"store": "hidden", "head": head} if hidden else {}),
        "protocol": described,
        "n_seq": n_seq,
        "model": model_identity(model),
        "tokenizer_identity": engine.tokenizer_identity(),
    }
    return BaseSetup(plan, header, metadata, settings, n_seq, coding)


def describe_run(setup: BaseSetup, protocol: Protocol, corpus_name: str, engine_name: str) -> str:
    plan, n_chunk = setup.plan, len(setup.plan.windows)
    what = (
        f"{n_chunk} chunks of {protocol.n_ctx} tokens"
        if protocol.name == "llamacpp"
        else f"{n_chunk} windows of up to {plan.n_ctx} tokens (protocol {protocol.name})"
    )
    return (
        f"base: {what} ({plan.n_source_tokens} tokens in {corpus_name}), {setup.n_seq} per pass, engine {engine_name}"
    )


def run_base(
    engine: Engine,
    corpus: Corpus,
    protocol: Protocol,
    chunks: int | None,
    out_path: str | None,
    fmt: str = "kldtool",
    sinks: Sinks | None = None,
    codec: str | None = None,
    resume: bool = False,
    force: bool = False,
    keep: int | None = None,
    clamp: float = DEFAULT_CLAMP,
    frame_rows: int | None = None,
    store: str = "logprobs",
    replay_tolerance: float = DEFAULT_TOLERANCE,
    head: str = "inline",
    routing: bool | None = None,
) -> dict:
    """``routing``: --routing / --no-routing, or None (pipeline/routing_base.py decides)."""
    sinks = sinks or Sinks()
    codec = codec or default_codec(fmt)
    check_store(store, fmt, keep, replay_tolerance, head)
    hidden = HiddenStore(engine, replay_tolerance, head) if store == "hidden" and out_path else None
    t0 = time.time()
    setup = setup_base(engine, corpus, protocol, chunks, fmt, codec, keep, clamp, frame_rows, force, hidden, head)
    sinks.info(describe_run(setup, protocol, corpus.name, engine.name))
    encode = (
        (lambda group: hidden.blocks(engine, group)) if hidden else (lambda group: engine.encode(group, setup.coding))
    )
    routed = base_routing(engine, routing, fmt, out_path, resume, setup.header)
    if routed:
        section, tap = routed
        setup.sections, plain = (section,), encode
        encode = lambda group: routed_blocks(plain(group), group, section, tap)  # noqa: E731
        sinks.info(f"base: recording MoE routing ({section.shape.bytes_per_token} bytes per token)")
    return write_run(setup, out_path, fmt, encode, sinks, resume, hidden, t0)


def write_run(setup: BaseSetup, out_path, fmt, encode, sinks: Sinks, resume=False, hidden=None, t0=None) -> dict:
    """Print the PPL of every window and write its rows; ``encode(group)`` yields a batch's
    ``(window, rows, nll)`` blocks: from the engine here, from shards' part files when the
    windows were scored on a cluster (cluster/base_shards.py)."""
    t0 = time.time() if t0 is None else t0
    plan, n_seq = setup.plan, setup.n_seq
    windows, n_chunk = plan.windows, len(plan.windows)
    ppl = PplAccumulator()
    writer, done = (
        _open_writer(
            out_path, fmt, setup.header, plan.stream, setup.metadata, setup.settings, windows, n_seq, resume, sinks, ppl
        )
        if out_path
        else (None, 0)
    )
    if writer:
        writer.sections = list(setup.sections)
    try:
        with Progress("base", n_chunk - done) as shown:
            for group in groups(windows[done:], n_seq):
                for w, nll in zip(group, _written(encode(group), writer)):
                    ppl.add(nll)
                    sinks.out(ppl_progress(w.index + 1, ppl.ppl))
                    shown.advance(tokens=len(nll))
        sinks.line()
        value, unc = ppl.estimate()
        sinks.info(final_estimate(value, unc))
        result = {
            "ppl": value,
            "ppl_uncertainty": unc,
            "scored_tokens": ppl.count,
            "chunks": n_chunk,
            "wall_time_s": round(time.time() - t0, 3),
        }
        if writer:
            extra = hidden.finish(writer) if hidden else {}
            writer.finish(extra | ({"result": result, "resumed_after_chunk": done} if done else {"result": result}))
            sinks.info(f"base: wrote {out_path} ({writer.format_name} format)")
    except BaseException:
        if ppl.count:
            sinks.line()  # end the progress line, so the messages below start on their own
        if writer:
            kept = writer.n_written > 0 and not isinstance(sys.exc_info()[1], ReplayMismatch)
            writer.abort(keep=kept)
            if kept:
                sinks.info(
                    f"base: stopped; {writer.n_written} chunks kept in {writer.out.tmp_path}; --resume continues it"
                )
        raise
    return result
