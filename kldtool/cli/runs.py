"""Commands that run a model: ``base`` (phase 1), ``compare`` (phase 2), ``ppl`` (score mode)
and ``noise-floor`` (the base model against its own file by another numeric path)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.options import (BOOTSTRAP, CORPUS, ENGINE, FRAME_ROWS, SCORING, ModelOpt, bootstrap_of, corpus_of,
                                 flags, longest, open_engine, protocol_of, start_loading)
from kldtool.errors import UsageError


@app.command()
@flags(corpus=CORPUS, scoring=SCORING, run=ENGINE)
def base(
    model: Optional[str] = ModelOpt,
    out: Optional[str] = typer.Option(None, "--kl-divergence-base", "--save-all-logits",
                                      help="Write the base file here (without it: perplexity only)."),
    fmt: str = typer.Option("kldtool", "--format", help="kldtool (compressed container) or llamacpp (raw, for llama-perplexity)."),
    codec: Optional[str] = typer.Option(None, "--codec", help="Row rounding: llamacpp (llama-perplexity's, default for "
                                                              "--format llamacpp) or grid (2^-12 steps, exact for bf16 logits; default otherwise)."),
    keep: Optional[str] = typer.Option(None, "--keep", help="top-K: store only each position's K most probable "
                                                            "entries and the rest's mass (kldtool format; ~V/3K "
                                                            "times smaller; KLD then a lower bound, see docs/metrics.md)."),
    clamp: float = typer.Option(16.0, "--clamp", help="Nats below each row's top that the stored codes span "
                                                      "(16..64; kldtool format beyond 16, as llama.cpp's layout "
                                                      "holds 16); KLD counts the base entries above -clamp."),
    frame_rows: Optional[int] = FRAME_ROWS,
    store: str = typer.Option("logprobs", "--store", help="logprobs (every scored position's full row) or hidden "
                                                          "(its final hidden state, and the output head once: "
                                                          "30-85x smaller; every engine but python factories without hidden())."),
    head: str = typer.Option("inline", "--head", help="--store hidden: inline (the output head stored once in the "
                                                      "file) or external (only its model's path and sha256: compare "
                                                      "reads it from that model)."),
    replay_tolerance: float = typer.Option(1e-5, "--replay-tolerance", help="--store hidden: the largest mean KLD "
                                                                            "(nats) between the engine's logits and "
                                                                            "those replayed from the file's first "
                                                                            "chunks; above it, no file."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the result as JSON here."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run that left the base file's "
                                                        "hidden partial beside it (same flags)."),
    corpus=None, scoring=None, run=None,
):
    """Phase 1: run the base model over a text, print its PPL and store its log-probs."""
    start_loading(run, model)
    from kldtool.codec import CODECS, check_clamp
    from kldtool.codec.topk import keep_of
    from kldtool.logitsfile import FORMATS, check_layout
    from kldtool.pipeline import run_base
    from kldtool.pipeline.hidden_base import check_store
    from kldtool.textio import write_json

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if codec is not None and codec not in CODECS:
        raise UsageError(f"--codec {codec!r}: expected one of {', '.join(CODECS)}")
    spec = protocol_of(scoring)
    top = keep_of(keep)
    try:
        clamp = check_clamp(clamp)
    except ValueError as e:
        raise UsageError(f"--clamp: {e}") from None
    check_layout(fmt, spec.name, top, clamp, frame_rows)  # before the model loads
    check_store(store, fmt, top, replay_tolerance, head)
    if run.contexts is not None:
        # The rows of a batch stream to the file as they come; lanes would hold whole batches.
        raise UsageError(f"--contexts {run.contexts}: for compare and ppl; base runs one context")
    text = corpus_of(corpus)
    eng = open_engine(run, model, longest(spec))
    try:
        if resume and not out:
            raise UsageError("--resume needs --kl-divergence-base FILE (the base file to continue)")
        result = run_base(eng, text, spec, scoring.chunks, out, fmt, codec=codec, resume=resume, force=scoring.force,
                          keep=top, clamp=clamp, frame_rows=frame_rows, store=store,
                          replay_tolerance=replay_tolerance, head=head)
    finally:
        eng.close()
    if json_out:
        write_json(json_out, result)


@app.command()
@flags(corpus=CORPUS, scoring=SCORING, run=ENGINE)
def ppl(
    models: Optional[list[str]] = typer.Option(None, "-m", "--model", help="Model (repeat for a checkpoint sweep: one "
                                                                        "table). Default: the built-in SmolLM2-135M."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the result(s) as JSON here."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the models' table as CSV here."),
    plot: Optional[str] = typer.Option(None, "--plot", help="documents with --lengths: PNG of PPL vs length here."),
    corpus=None, scoring=None, run=None,
):
    """Score mode: a model's perplexity under any protocol, without a base file."""
    start_loading(run, (models or [None])[0])
    from kldtool.pipeline.ppl import run_ppl
    from kldtool.report.ppl_table import csv_text, print_table
    from kldtool.textio import write_json, write_text

    spec = protocol_of(scoring)
    if plot and not spec.lengths:
        raise UsageError("--plot draws PPL against --lengths: give --protocol documents --lengths N,N,...")
    text = corpus_of(corpus)
    results = []
    for m in models or [None]:
        eng = open_engine(run, m, longest(spec))
        try:
            results.append(run_ppl(eng, text, spec, scoring.chunks, force=scoring.force))
        finally:
            eng.close()
    if len(results) > 1:
        print_table(results)
    if json_out:
        write_json(json_out, results[0] if len(results) == 1 else {"runs": results})
    if csv_out:
        write_text(csv_out, csv_text(results))
    if plot:
        from kldtool.report.plots import ppl_vs_length

        ppl_vs_length(results, plot)


@app.command()
@flags(run=ENGINE, boot=BOOTSTRAP)
def compare(
    base_file: Optional[str] = typer.Option(None, "--kl-divergence-base", "--save-all-logits",
                                            help="Base file written by `kldtool base` or llama-perplexity."),
    model: Optional[str] = ModelOpt,
    kl_divergence: bool = typer.Option(False, "--kl-divergence", help="Accepted for llama-perplexity familiarity; always on."),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help="Must match the base file if given."),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="Must match the base file if given (it is "
                                                                    "taken from the file)."),
    stride: Optional[int] = typer.Option(None, "--stride", help="Must match the base file if given."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Must match the base file if given."),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Ignored: the tokens come from the base file."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every statistic and the run's metadata here."),
    force: bool = typer.Option(False, "--force", help="Compare even when the tokenizer or BOS policy differ, or the "
                                                      "chunks exceed the model's trained context (noted in every output)."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    chunk_range: Optional[str] = typer.Option(None, "--chunk-range", help="Use chunks A:B only (0-based, end excluded: "
                                                                          "printed as A+1..B); for shards, see `merge`."),
    state: Optional[str] = typer.Option(None, "--state", help="Checkpoint the accumulators here (atomically) while "
                                                              "running and at the end; a shard for `kldtool merge`."),
    checkpoint_every: Optional[str] = typer.Option(None, "--checkpoint-every", help="With --state: every N chunks "
                                                                                    "(10) or seconds (60s, default)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the --state checkpoint (if there is one)."),
    per_token: Optional[str] = typer.Option(None, "--per-token", help="Write every scored token's values "
                                                                      "(nll, KLD, Δp, same top...) to this HDF5 file."),
    noise_floor: Optional[str] = typer.Option(None, "--noise-floor", help="A `kldtool noise-floor --json` result "
                                                                          "of this base file: also print the mean "
                                                                          "KLD as a multiple of that floor."),
    head_from: Optional[str] = typer.Option(None, "--head-from", help="A hidden-state file written with --head "
                                                                      "external: read its output head from this "
                                                                      "model (GGUF or checkpoint directory) instead "
                                                                      "of the path the file names; its sha256 must "
                                                                      "match."),
    run=None, boot=None,
):
    """Phase 2: run a model over a base file's tokens and print llama-perplexity's KLD statistics."""
    start_loading(run, model)
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.compare import Checkpoints, check_protocol_flags, parse_chunk_range
    from kldtool.pipeline.noise_floor import load_floor

    del kl_divergence
    if base_file is None:
        raise UsageError("compare needs --kl-divergence-base FILE (written by `kldtool base` or llama-perplexity)")
    checkpoints = Checkpoints.parse(state, checkpoint_every, resume)
    resampling = bootstrap_of(boot)
    reader = open_base_file(base_file)
    try:
        floor = load_floor(noise_floor, reader) if noise_floor else None
        if run.server and head_from:
            raise UsageError(f"--head-from {head_from}: with --server the server's workers read the output head "
                             f"the base file names")
        if not run.server:  # a server's workers read the head themselves: the client loads none
            reader.use_head(head_from)  # an external head is found and checked now, before the model runs
        check_protocol_flags(reader, protocol, ctx_size, stride, lengths)
        span = parse_chunk_range(chunk_range, chunks, reader.header.n_chunk, base_file)
        if file is not None:
            print(f"note: -f {file} ignored: the tokens come from {base_file}", file=sys.stderr)
        eng = open_engine(run, model, reader.header.n_ctx)
        try:
            run_compare(eng, reader, force=force, json_path=json_out, chunk_range=span, checkpoints=checkpoints,
                        per_token_path=per_token, bootstrap=resampling, floor=floor)
        finally:
            eng.close()
    finally:
        reader.close()


@app.command("noise-floor")
@flags(run=ENGINE)
def noise_floor_cmd(
    base_file: Optional[str] = typer.Option(None, "--kl-divergence-base", help="The base file (its model is the default -m)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="The base model again (default: the one the base "
                                                                     "file names), run another valid way."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the floor here (for compare --noise-floor)."),
    run=None,
):
    """The base model against its own base file through another numeric path (dtype, batch size,
    device or engine): the KLD below which a quant cannot be told from the base."""
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.compare import parse_chunk_range
    from kldtool.pipeline.noise_floor import run_noise_floor

    if base_file is None:
        raise UsageError("noise-floor needs --kl-divergence-base FILE")
    reader = open_base_file(base_file)
    try:
        named = reader.metadata.get("model", {}).get("model")
        if model is None and not named:
            raise UsageError(f"noise-floor: {base_file} does not name its model; give -m")
        span = parse_chunk_range(None, chunks, reader.header.n_chunk, base_file)
        eng = open_engine(run, model or named, reader.header.n_ctx)
        try:
            run_noise_floor(eng, reader, json_path=json_out, chunk_range=span)
        finally:
            eng.close()
    finally:
        reader.close()
