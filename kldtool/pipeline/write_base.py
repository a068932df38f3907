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

from kldtool.codec import Coding
from kldtool.engines.contract import Engine, description, label
from kldtool.errors import ReplayMismatch, UsageError
from kldtool.pipeline import engine_modes
from kldtool.provenance.identity import model_identity, tokenizer_identity
from kldtool.text.corpus import Corpus
from kldtool.logitsfile import BaseHeader, create_writer
from kldtool.pipeline.sinks import Sinks
from kldtool.runtime.progress import Progress
from kldtool.pipeline.base_job import BaseJob
from kldtool.pipeline.batching import groups, whole_batches
from kldtool.provenance.manifest import run_metadata
from kldtool.pipeline.hidden_base import HiddenStore, check_store
from kldtool.pipeline.plan import Plan, make_plan
from kldtool.pipeline.routing_base import base_routing, routed_blocks
from kldtool.provenance.manifest import run_manifest
from kldtool.text.protocols import HALF_SCORED_CHUNKS, Protocol, window_table
from kldtool.report.console import final_estimate, ppl_progress
from kldtool.stats import PplAccumulator


def plan_header(plan: Plan, n_vocab: int, coding: Coding) -> BaseHeader:
    """llama.cpp's uniform chunks keep its header; other protocols carry their window table."""
    if plan.protocol.name == HALF_SCORED_CHUNKS:
        return BaseHeader(
            n_ctx=plan.protocol.n_ctx, n_vocab=n_vocab, n_chunk=len(plan.windows), keep=coding.keep, clamp=coding.clamp
        )
    return BaseHeader(
        n_ctx=plan.n_ctx,
        n_vocab=n_vocab,
        n_chunk=len(plan.windows),
        windows=window_table(plan.windows),
        n_stream=len(plan.stream),
        keep=coding.keep,
        clamp=coding.clamp,
    )


def _open_writer(setup: "BaseSetup", job: BaseJob, sinks, ppl):
    out_path, resume, settings = job.out_path, job.resume, setup.settings
    windows, n_seq = setup.plan.windows, setup.n_seq
    writer = create_writer(
        out_path,
        job.fmt,
        setup.header,
        setup.plan.stream,
        setup.metadata,
        settings,
        resume=resume,
        frame_rows=settings["frame_rows"],
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


@dataclass(kw_only=True)
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


def setup_base(engine, corpus, job: BaseJob, hidden=None) -> BaseSetup:
    """The run's plan and everything the file records of it (the same on every node that
    builds it from the same engine, text and flags: cluster/base_shards.py relies on that)."""
    job = job.resolved()
    coding, keep, codec, fmt = job.coding, job.keep, job.codec, job.fmt
    plan = make_plan(engine, corpus, job.protocol, job.chunks, job.force)
    if keep and keep > engine.facts.n_vocab:
        raise UsageError(f"--keep top-{keep}: the vocabulary has only {engine.facts.n_vocab} entries")
    header = plan_header(plan, engine.facts.n_vocab, coding)
    n_seq = engine.windows_per_call(plan.n_ctx)
    described = plan.describe(engine.facts.bos_id)
    model = description(engine.facts)
    metadata = (
        run_metadata("base")
        | {
            "protocol": described,
            "corpus": corpus.name,
            "model": model,
            "tokenizer_identity": tokenizer_identity(engine),
            "manifest": run_manifest(engine),
            "n_vocab": engine.facts.n_vocab,
            "codec": codec,
            "n_seq": n_seq,
        }
        | (hidden.metadata if hidden else {})
        | ({"generated": {"finish": plan.finish}} if plan.finish else {})  # compare splits its KLD by them
    )
    settings = {
        "format": fmt,
        "codec": codec,
        "keep": keep,
        "clamp": job.clamp,
        "frame_rows": job.frame_rows,
        **({"store": "hidden", "head": job.head} if hidden else {}),
        "protocol": described,
        "n_seq": n_seq,
        "model": model_identity(model),
        "tokenizer_identity": tokenizer_identity(engine),
    }
    return BaseSetup(plan=plan, header=header, metadata=metadata, settings=settings, n_seq=n_seq, coding=coding)


def describe_run(setup: BaseSetup, protocol: Protocol, corpus_name: str, engine_name: str) -> str:
    plan, n_chunk = setup.plan, len(setup.plan.windows)
    what = (
        f"{n_chunk} chunks of {protocol.n_ctx} tokens"
        if protocol.name == HALF_SCORED_CHUNKS
        else f"{n_chunk} windows of up to {plan.n_ctx} tokens (protocol {protocol.name})"
    )
    return (
        f"base: {what} ({plan.n_source_tokens} tokens in {corpus_name}), {setup.n_seq} per pass, engine {engine_name}"
    )


def run_base(engine: Engine, corpus: Corpus, job: BaseJob, sinks: Sinks | None = None) -> dict:
    sinks = sinks or Sinks()
    job = job.resolved()
    check_store(job.store, job.fmt, job.keep, job.replay_tolerance, job.head)
    hidden = HiddenStore(engine, job.replay_tolerance, job.head) if job.store == "hidden" and job.out_path else None
    t0 = time.time()
    setup = setup_base(engine, corpus, job, hidden)
    sinks.info(describe_run(setup, job.protocol, corpus.name, label(engine)))
    encode = (
        (lambda group: hidden.blocks(engine, group))
        if hidden
        else (lambda group: engine_modes.encode(engine, group, setup.coding))
    )
    routed = base_routing(engine, job.routing, job.fmt, job.out_path, job.resume, setup.header)
    if routed:
        section, tap = routed
        setup.sections, plain = (section,), encode
        encode = lambda group: routed_blocks(plain(group), group, section, tap)  # noqa: E731
        sinks.info(f"base: recording MoE routing ({section.shape.bytes_per_token} bytes per token)")
    return write_run(setup, job, encode, sinks, hidden, t0)


def write_run(setup: BaseSetup, job: BaseJob, encode, sinks: Sinks, hidden=None, t0=None) -> dict:
    """Print the PPL of every window and write its rows; ``encode(group)`` yields a batch's
    ``(window, rows, nll)`` blocks: from the engine here, from shards' part files when the
    windows were scored on a cluster (cluster/base_shards.py)."""
    t0 = time.time() if t0 is None else t0
    out_path = job.out_path
    plan, n_seq = setup.plan, setup.n_seq
    windows, n_chunk = plan.windows, len(plan.windows)
    ppl = PplAccumulator()
    writer, done = _open_writer(setup, job, sinks, ppl) if out_path else (None, 0)
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
