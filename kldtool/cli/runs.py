"""Commands that run a model over a text: ``base`` (phase 1) and ``ppl`` (score mode)."""

from __future__ import annotations

import os
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import CORPUS, ENGINE, FRAME_ROWS, PROGRESS, SCORING, ModelOpt
from kldtool.cli.ray_flags import RAY, SHARDS
from kldtool.runtime.progress import choose as choose_progress
from kldtool.cli.options import corpus_of, flags, longest, open_engine, protocol_of, start_loading
from kldtool.errors import OutputError, UsageError


@app.command()
@flags(corpus=CORPUS, scoring=SCORING, engine_flags=ENGINE, display=PROGRESS, cluster=RAY | SHARDS)
def base(
    model: Optional[str] = ModelOpt,
    out: Optional[str] = typer.Option(
        None,
        "--kl-divergence-base",
        "--save-all-logits",
        help="Write the base file here (without it: perplexity only).",
    ),
    fmt: str = typer.Option(
        "kldtool", "--format", help="kldtool (compressed container) or llamacpp (raw, for llama-perplexity)."
    ),
    codec: Optional[str] = typer.Option(
        None,
        "--codec",
        help="Row rounding: llamacpp (llama-perplexity's, default for "
        "--format llamacpp) or grid (2^-12 steps, exact for bf16 logits; default otherwise).",
    ),
    keep: Optional[str] = typer.Option(
        None,
        "--keep",
        help="top-K: store only each position's K most probable "
        "entries and the rest's mass (kldtool format; ~V/3K "
        "times smaller; KLD then a lower bound, see docs/metrics.md).",
    ),
    clamp: float = typer.Option(
        16.0,
        "--clamp",
        help="Nats below each row's top that the stored codes span "
        "(16..64; kldtool format beyond 16, as llama.cpp's layout "
        "holds 16); KLD counts the base entries above -clamp.",
    ),
    frame_rows: Optional[int] = FRAME_ROWS,
    store: str = typer.Option(
        "logprobs",
        "--store",
        help="logprobs (every scored position's full row) or hidden "
        "(its final hidden state, and the output head once: "
        "30-85x smaller; every engine but python factories without hidden()).",
    ),
    head: str = typer.Option(
        "inline",
        "--head",
        help="--store hidden: inline (the output head stored once in the "
        "file) or external (only its model's path and sha256: compare "
        "reads it from that model).",
    ),
    replay_tolerance: float = typer.Option(
        1e-5,
        "--replay-tolerance",
        help="--store hidden: the largest mean KLD "
        "(nats) between the engine's logits and "
        "those replayed from the file's first "
        "chunks; above it, no file.",
    ),
    routing: Optional[bool] = typer.Option(
        None,
        "--routing/--no-routing",
        help="Store each scored position's MoE expert ids and router probabilities (default: on for a MoE "
        "model in the kldtool format with the transformers or llamacpp engine; vLLM gives no routing on its "
        "hooked runner: docs/metrics.md).",
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the result as JSON here."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the interrupted run that left the base file's hidden partial beside it (same flags).",
    ),
    corpus=None,
    scoring=None,
    engine_flags=None,
    display=None,
    cluster=None,
):
    """Phase 1: run the base model over a text, print its PPL and store its log-probs."""
    choose_progress(display.progress)
    if cluster.ray is None:  # on a cluster the workers load it
        start_loading(engine_flags, model)
    from kldtool.cli.base_layout import checked_layout
    from kldtool.pipeline import run_base
    from kldtool.pipeline.base_job import BaseJob
    from kldtool.pipeline.hidden_base import check_store
    from kldtool.runtime.small_files import write_json

    spec = protocol_of(scoring, corpus)
    top, clamp = checked_layout(fmt, codec, keep, clamp, frame_rows, spec.name)  # before the model loads
    check_store(store, fmt, top, replay_tolerance, head)
    if engine_flags.contexts is not None:
        # The rows of a batch stream to the file as they come; lanes would hold whole batches.
        raise UsageError(f"--contexts {engine_flags.contexts}: for compare and ppl; base runs one context")
    from kldtool.cli.base_ray import base_on_cluster, wants_cluster

    job = BaseJob(
        protocol=spec,
        out_path=out,
        chunks=scoring.chunks,
        fmt=fmt,
        codec=codec,
        keep=top,
        clamp=clamp,
        frame_rows=frame_rows,
        force=scoring.force,
        resume=resume,
        store=store,
        replay_tolerance=replay_tolerance,
        head=head,
        routing=routing,
    )
    if wants_cluster(cluster):
        result = base_on_cluster(cluster, engine_flags, corpus, model, job)
        return write_json(json_out, result) if json_out else None
    text = corpus_of(corpus, engine_flags.engine, model)
    eng = open_engine(engine_flags, model, longest(spec, text))
    try:
        if resume and not out:
            raise UsageError("--resume needs --kl-divergence-base FILE (the base file to continue)")
        result = run_base(eng, text, job)
    finally:
        eng.close()
    if json_out:
        write_json(json_out, result)


@app.command()
@flags(corpus=CORPUS, scoring=SCORING, engine_flags=ENGINE, display=PROGRESS)
def ppl(
    models: Optional[list[str]] = typer.Option(
        None,
        "-m",
        "--model",
        help="Model (repeat for a checkpoint sweep: one table). Default: the built-in SmolLM2-135M.",
    ),
    checkpoints: Optional[str] = typer.Option(
        None,
        "--checkpoints",
        help="-m a helibrunna run: its checkpoints to score (all, last, steps, names, globs: 20000,40000,last), "
        "with -o DIR; one table with the training loss at each step.",
    ),
    out_dir: Optional[str] = typer.Option(
        None, "-o", "--out-dir", help="--checkpoints: a result per checkpoint here (a rerun keeps them)."
    ),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the result(s) as JSON here."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the models' table as CSV here."),
    plot: Optional[str] = typer.Option(
        None,
        "--plot",
        help="documents with --lengths: PNG of PPL vs length here; with --checkpoints a directory for "
        "ppl_vs_length.png and loss_vs_ppl.png.",
    ),
    corpus=None,
    scoring=None,
    engine_flags=None,
    display=None,
):
    """Score mode: a model's perplexity under any protocol, without a base file."""
    choose_progress(display.progress)
    start_loading(engine_flags, (models or [None])[0])
    from kldtool.pipeline.ppl import run_ppl
    from kldtool.pipeline.ppl_job import PplJob
    from kldtool.runtime.small_files import write_json, write_text

    spec = protocol_of(scoring, corpus)
    if checkpoints is None and out_dir is not None:
        raise UsageError("-o/--out-dir: only with --checkpoints (a result per checkpoint)")
    if plot and not spec.lengths and checkpoints is None:
        raise UsageError("--plot draws PPL against --lengths: give --protocol documents --lengths N,N,...")
    if checkpoints is not None and (len(models or []) != 1 or out_dir is None):
        raise UsageError("--checkpoints: give one -m RUN_DIR (a helibrunna run) and -o DIR for the results")
    text = corpus_of(corpus, engine_flags.engine, (models or [None])[0])

    def score(model: str | None) -> dict:
        eng = open_engine(engine_flags, model, longest(spec, text))
        try:
            return run_ppl(eng, text, PplJob(spec, scoring.chunks, scoring.force))
        finally:
            eng.close()

    if checkpoints is not None:
        from kldtool.pipeline.checkpoint_sweep import run_checkpoints, sweep_key
        from kldtool.report import checkpoints as table

        key = sweep_key(corpus.file, spec.describe() | {"corpus_format": text.format}, scoring.chunks)
        results = run_checkpoints(models[0], checkpoints, out_dir, key, lambda c: score(str(c.path)))
        table.print_table(results)
        csv = table.csv_text
    else:
        from kldtool.report.ppl_table import csv_text as csv, print_table

        results = [score(m) for m in models or [None]]
        if len(results) > 1:
            print_table(results)
    if json_out:
        write_json(json_out, results[0] if len(results) == 1 and checkpoints is None else {"runs": results})
    if csv_out:
        write_text(csv_out, csv(results))
    if plot:
        _plots(results, plot, checkpoints is not None)


def _plots(results: list[dict], plot: str, sweep: bool) -> None:
    from kldtool.report.plots import loss_vs_ppl, ppl_vs_length

    if not sweep:
        ppl_vs_length(results, plot)
        return
    try:
        os.makedirs(plot, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{plot}: cannot make the plot directory ({e.strerror})") from None
    if len(results[0].get("per_length", [])) > 1:
        ppl_vs_length(results, os.path.join(plot, "ppl_vs_length.png"))
    loss_vs_ppl(results, os.path.join(plot, "loss_vs_ppl.png"))
