"""Phase 2: run a (quantized) model over a base file's tokens and stream llama.cpp's KLD statistics.

A run in three named steps (``_CompareRun``, behind ``compare_files`` and ``run_compare``): ``start`` (the model checked against the file, the
run's identity, a checkpoint resumed, the per-token writer opened), ``loop`` (the engine's
schedule scores the windows; each chunk's records are accumulated, printed and, with a state
file, checkpointed where one of the engine's batches ends) and ``result`` (the final blocks and
the JSON result).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

from kldtool.analysis.per_token import PerTokenWriter
from kldtool.engines import registry
from kldtool.engines.contract import BOUNDED, description, label
from kldtool.pipeline import engine_modes
from kldtool.provenance.identity import base_identity, tokenizer_identity
from kldtool.logitsfile import frame_facts
from kldtool.provenance.manifest import run_manifest, run_metadata
from kldtool.pipeline.batching import batch_ends, groups, last_end
from kldtool.pipeline.checkpoints import start_state
from kldtool.pipeline.early_stop import stop_line
from kldtool.pipeline.file_flags import check_file_flags, span_and_floor
from kldtool.pipeline.compare_job import CompareJob
from kldtool.pipeline.compat import base_windows, check_compatible, file_protocol
from kldtool.pipeline.final_report import final_report, replay
from kldtool.pipeline.routing_compare import compare_routing
from kldtool.pipeline.sinks import Sinks
from kldtool.runtime.memory import note_long_window
from kldtool.runtime.progress import Progress
from kldtool.analysis.state_file import save_state
from kldtool.report.console import TABLE_HEADER, chunk_line
from kldtool.provenance.sizes import model_size_dict
from kldtool.runtime.small_files import write_json
from kldtool.stats import summarize
from kldtool.stats.depth import depth_block, parse_depth_bins, window_depths


def compare_files(job: CompareJob, sinks: Sinks | None = None) -> dict:
    """The compare of the base file and engine ``job`` names: the file and then the engine
    opened, and closed in one ExitStack however the run ends; every flag that must agree with
    the file is checked once it is open, before the model loads."""
    from kldtool.engines import make_engine
    from kldtool.logitsfile import open_base_file

    with ExitStack() as opened:
        reader = open_base_file(job.base_path)
        opened.callback(reader.close)
        span, floor = check_file_flags(job, reader)
        engine = make_engine(job.engine, reader.header.n_ctx)
        opened.callback(engine.close)
        note_long_window(reader.header.n_ctx)
        return _CompareRun(engine, reader, job, sinks or Sinks(), span).whole(floor)


def run_compare(
    engine, reader, job: CompareJob = CompareJob(), sinks: Sinks | None = None, label: str = "compare"
) -> dict:
    """``job`` on an engine and a base file the caller opened: the whole run, its result
    returned (and written where ``job.json_path`` says); ``label`` names its progress bar."""
    span, floor = span_and_floor(job, reader)
    return _CompareRun(engine, reader, job, sinks or Sinks(), span).whole(floor, label)


def depth_bounds(windows, spec: str | None, from_answer: bool = False) -> list[int]:
    """The depth buckets' bounds over the depths the windows score (``from_answer``: counted from
    each window's first scored position, a generated answer's start)."""
    scored = [w for w in windows if w.n_scored]
    if not scored:
        return [1, 2]
    origin = (lambda w: 0) if from_answer else (lambda w: w.first)
    return parse_depth_bins(spec, min(origin(w) + 1 for w in scored), max(origin(w) + w.n_scored for w in scored))


class _CompareRun:
    """One compare on an open engine and base file, over the windows ``span``."""

    def __init__(self, engine, reader, job: CompareJob, sinks: Sinks, span: tuple[int, int]):
        self.engine, self.reader, self.sinks, self.ck = engine, reader, sinks, job.checkpoints
        self.job, self.bootstrap, self.span = job, job.bootstrap, span
        self.t0 = time.time()

    def whole(self, noise_floor: dict | None, label: str = "compare") -> dict:
        """start, loop and result, the run's three steps."""
        self.start()
        self.loop(label)
        return self.result(self.job.json_path, noise_floor)

    def start(self) -> None:
        """The model checked against the file, the run's identity, a checkpoint resumed, the
        per-token writer and the routing comparison opened."""
        engine, reader, sinks, job = self.engine, self.reader, self.sinks, self.job
        per_token_path, order, stopping, depth_bins = job.per_token_path, job.order, job.stopping, job.depth_bins
        self.warnings = check_compatible(engine, reader, job.force)
        windows = base_windows(reader, engine.facts.bos_id)
        protocol = file_protocol(reader)
        self.from_answer = protocol.get("scored") == "generated"
        for w in self.warnings:
            sinks.info("warning: " + w)
        h = reader.header
        a, b = self.span
        self.n_seq = engine.windows_per_call(h.n_ctx)
        self.order, self.stopping, self.stopped = order, stopping, None
        self.meta = {
            "base": base_identity(reader),
            "base_path": reader.path,
            "model": description(engine.facts),
            "chunk_range": [a, b],
            "order": order.describe(),
            "n_seq": self.n_seq,
            "warnings": self.warnings,
            "protocol": protocol,
            "manifest": run_manifest(engine),
            # From every window of the file, so shards of one run have the same buckets.
            "depth_bounds": depth_bounds(windows, depth_bins, self.from_answer),
            "depth_shown": depth_bins is not None,
        }
        self.meta |= _answers_meta(reader, self.from_answer)
        self.state = start_state(self.ck, self.meta, sinks)
        self.in_range = order.arrange(windows[a:b])
        self.ends = stopping.ends(b - a)
        self.batch_ends = batch_ends(self.in_range, self.n_seq, self.ends)  # no batch runs across a segment's end
        done = self.state.visited
        self.per_token = None
        if per_token_path and not (self.state.complete and os.path.exists(per_token_path)):
            self.per_token = PerTokenWriter(per_token_path, self.meta, resume_tokens=self.state.acc.count)
        # Before the schedule: an engine recording routing may run its windows otherwise.
        self.routing = compare_routing(engine, reader, sinks, self.state, self.per_token)
        self.schedule = self._schedule()
        where = f"chunks {a + done + 1}..{b}" if not order.random else f"{b - a - done} windows of chunks {a + 1}..{b}"
        sinks.info(
            f"compare: {where} of {h.n_chunk}, order {order}, n_ctx={h.n_ctx}, n_seq={self.n_seq}, "
            f"engine {label(engine)}{self.schedule.note if self.schedule else ''}, "
            f"base {reader.path} "
            f"({reader.format_name})"
        )
        replay_error = reader.metadata.get("replay")
        if replay_error:
            sinks.info(
                f"compare: the base file stores hidden states; its replay floor: mean KLD "
                f"{replay_error['kld_mean']:.3g} (max {replay_error['kld_max']:.3g}, |Δlogit| up to "
                f"{replay_error['max_abs_dlogit']:.3g})"
            )
        sinks.line()
        sinks.line(TABLE_HEADER)
        self.acc = self.state.acc = replay(self.state.acc, sinks)

    def _schedule(self):
        """The engine's schedule for the windows from the last one scored to the next segment's
        end, or None when the run has nothing more to score."""
        done = len(self.state.acc.chunks)
        # The rule looks only where a segment ends (a resumed checkpoint may lie between them).
        if done in self.ends:
            self.stopped = self.stopping.verdict(self.state.acc.chunk_vectors, len(self.in_range), self.bootstrap)
        end = next((e for e in self.ends if e > done), None)
        if end is None or self.stopped:
            return None
        return engine_modes.schedule(self.engine, list(groups(self.in_range[done:end], self.n_seq)))

    def _checkpoint(self) -> None:
        # Records reach the disk before the state: they must never hold fewer tokens than it.
        if self.per_token:
            self.per_token.flush()
        if self.routing:
            self.state.routing = self.routing.stats.matrix()
        save_state(self.ck.path, self.state)

    def loop(self, label: str = "compare") -> None:
        first = True
        with Progress(label, len(self.in_range) - len(self.acc.chunks)) as shown:
            while self.schedule is not None:
                self._score(self.schedule, first, shown)
                first = False
                self.schedule = self._schedule()
        if self.stopped:
            self.state.meta["stopped"] = self.stopped
        if self.ck.path:
            self._checkpoint()

    def _score(self, schedule, first: bool, shown: Progress) -> None:
        """Score one segment's windows, adding their records as they come."""
        acc, ck, sinks = self.acc, self.ck, self.sinks
        scored = engine_modes.scored(schedule, self.reader, warm=first)
        last_save, saved_at = time.time(), len(acc.chunks)
        t_pass = time.time()
        try:
            for gi, (group, records) in enumerate(scored):
                if gi == 0 and first:  # the schedule's first calls run side by side
                    per_pass = time.time() - t_pass
                    sinks.info(
                        f"compare: {per_pass:.2f} seconds per pass - ETA "
                        f"{per_pass * schedule.rounds / 60:.2f} minutes"
                        + (" to the first look" if len(self.ends) > 1 else "")
                    )
                for w, rec in zip(group, records):
                    # Records first: wherever Ctrl-C lands, they cover every chunk the accumulator
                    # holds, and --resume cuts them back to the checkpoint.
                    if self.per_token:
                        self.per_token.add(w.index, w.scored_positions(), w.targets, rec)
                    if self.routing:
                        self.routing.add(w, rec)
                    bounds = acc.depth_bounds
                    depths = window_depths(0 if self.from_answer else w.first, len(rec))
                    acc.add(rec, w.index, bounds and depth_block(rec, depths, bounds))
                    sinks.line(chunk_line(w.index + 1, summarize(acc, with_quantiles=False)))
                    shown.advance(tokens=len(rec))
                due = (
                    ck.chunks is not None and len(acc.chunks) - saved_at >= ck.chunks
                ) or time.time() - last_save >= ck.seconds
                # Only where one of llama-perplexity's batches ends (a schedule may take pieces of
                # them): a resumed run starts a batch there and evaluates the same batches.
                done = len(acc.chunks)
                if ck.path and due and not self.state.complete and last_end(self.batch_ends, done) == done:
                    self._checkpoint()
                    last_save, saved_at = time.time(), len(acc.chunks)
        except BaseException:
            if ck.path:
                # Keep whole batches only: a resumed run must evaluate the same batches.
                acc.truncate(last_end(self.batch_ends, len(acc.chunks)))
                if self.routing:
                    self.routing.stats.truncate(len(acc.chunks))
                if len(acc.chunks) > saved_at:
                    self._checkpoint()
                sinks.info(
                    f"compare: stopped with {self.state.progress()}; checkpoint in {ck.path}, --resume continues it"
                )
            if self.per_token:
                self.per_token.close(keep=bool(ck.path))
            raise
        finally:
            scored.close()  # waits for the engine's calls in progress

    def _sources(self) -> dict:
        """The base file and the model the result names."""
        engine, reader = self.engine, self.reader
        return {
            "base": self.meta["base"],
            "base_file": {
                "path": reader.path,
                "format": reader.format_name,
                "n_vocab": reader.header.n_vocab,
                **frame_facts(reader),
                "metadata": reader.metadata,
            },
            "model": description(engine.facts),
            "model_size": model_size_dict(engine.facts.model),
            "tokenizer_identity": {
                "model": tokenizer_identity(engine),
                "base": reader.metadata.get("tokenizer_identity"),
            },
        }

    def result(self, json_path: str | None, noise_floor: dict | None) -> dict:
        engine, reader, meta, (a, b) = self.engine, self.reader, self.meta, self.span
        h = reader.header
        result = run_metadata("compare") | {
            "protocol": meta["protocol"],
            "n_ctx": h.n_ctx,
            "chunks": b - a,
            "chunk_range": [a, b],
            "order": self.order.describe(),
            "windows_scored": len(self.acc.chunks),
            "stopped": self.stopped,
            "scored_tokens": self.acc.count,
            **self._sources(),
            "manifest": meta["manifest"],
            "base_manifest": reader.metadata.get("manifest"),
            "state": self.ck.path,
            "resumed_at_chunks": self.state.meta.get("resumed", []),
            "warnings": self.warnings,
            "replay_floor": reader.metadata.get("replay"),
        }
        if self.job.command_line:
            result["command_line"] = list(self.job.command_line)
        measure = getattr(engine, "served_floor", None)  # a served model's own repeatability
        if measure:
            result["served_floor"] = measure(len(self.acc.chunks))
            if result["served_floor"]:
                self.sinks.info(result["served_floor"]["summary"])
        acc = self.acc.in_window_order()
        bounded = engine.bounded if registry.has(engine, BOUNDED) else None  # a server's top-K: the KLD is a bound
        result["statistics"] = final_report(
            acc,
            self.sinks,
            self.warnings,
            self.bootstrap,
            h.keep,
            noise_floor,
            bounded(resumed=bool(self.state.meta.get("resumed"))) if bounded else None,
            show_depth=meta["depth_shown"],
            depth_origin=meta.get("depth_origin", "window"),
            finish=meta.get("finish"),
        )
        if self.routing:
            result["statistics"]["routing"] = self.routing.report(self.sinks, self.bootstrap)
        if self.stopped:
            self.sinks.line(stop_line(self.stopped, self.order))
        result["chunk_sums"] = acc.chunk_table()
        result["wall_time_s"] = round(time.time() - self.t0, 3)
        if self.per_token:
            self.per_token.finish(result["statistics"])
            result["per_token"] = str(self.per_token.path)
        if json_path:
            write_json(json_path, result)
        return result


def _answers_meta(reader, from_answer: bool) -> dict:
    """A generated corpus's base: depths count from each answer's start, and each answer's
    finish reason goes into the run's meta for the KLD by it (merge reads it there too)."""
    meta = {"depth_origin": "answer"} if from_answer else {}
    finish = (reader.metadata.get("generated") or {}).get("finish")
    return meta | ({"finish": finish} if finish else {})
