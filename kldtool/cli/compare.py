"""Commands that run a model over a base file's tokens: ``compare`` (phase 2) and ``noise-floor``
(the base model against its own file by another numeric path)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import BOOTSTRAP, ENGINE, PROGRESS, ModelOpt
from kldtool.cli.options import bootstrap_of, engine_options, flags, open_engine, start_loading
from kldtool.runtime.progress import choose as choose_progress
from kldtool.errors import UsageError


@app.command()
@flags(engine_flags=ENGINE, bootstrap_flags=BOOTSTRAP, display=PROGRESS)
def compare(
    base_file: Optional[str] = typer.Option(
        None,
        "--kl-divergence-base",
        "--save-all-logits",
        help="Base file written by `kldtool base` or llama-perplexity.",
    ),
    model: Optional[str] = ModelOpt,
    kl_divergence: bool = typer.Option(
        False, "--kl-divergence", help="Accepted for llama-perplexity familiarity; always on."
    ),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help="Must match the base file if given."),
    protocol: Optional[str] = typer.Option(
        None, "--protocol", help="Must match the base file if given (it is taken from the file)."
    ),
    stride: Optional[int] = typer.Option(None, "--stride", help="Must match the base file if given."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Must match the base file if given."),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Ignored: the tokens come from the base file."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every statistic and the run's metadata here."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Compare even when the tokenizer or BOS policy differ, or the "
        "chunks exceed the model's trained context (noted in every output).",
    ),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    chunk_range: Optional[str] = typer.Option(
        None,
        "--chunk-range",
        help="Use chunks A:B only (0-based, end excluded: printed as A+1..B); for shards, see `merge`.",
    ),
    state: Optional[str] = typer.Option(
        None,
        "--state",
        help="Checkpoint the accumulators here (atomically) while running and at the end; a shard for `kldtool merge`.",
    ),
    checkpoint_every: Optional[str] = typer.Option(
        None, "--checkpoint-every", help="With --state: every N chunks (10) or seconds (60s, default)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the --state checkpoint (if there is one)."),
    per_token: Optional[str] = typer.Option(
        None, "--per-token", help="Write every scored token's values (nll, KLD, Δp, same top...) to this HDF5 file."
    ),
    noise_floor: Optional[str] = typer.Option(
        None,
        "--noise-floor",
        help="A `kldtool noise-floor --json` result "
        "of this base file: also print the mean "
        "KLD as a multiple of that floor.",
    ),
    head_from: Optional[str] = typer.Option(
        None,
        "--head-from",
        help="A hidden-state file written with --head "
        "external: read its output head from this "
        "model (GGUF or checkpoint directory) instead "
        "of the path the file names; its sha256 must "
        "match.",
    ),
    order: Optional[str] = typer.Option(
        None,
        "--order",
        help="Visit the windows in the file's order (file, the default) or in a seeded permutation "
        "(random, random:SEED): a run stopped early is then a sample of the whole corpus.",
    ),
    target_ci: Optional[float] = typer.Option(
        None,
        "--target-ci",
        help="Stop once mean KLD's interval for all the windows is at most this fraction of the mean on "
        "each side (0.02: ±2 %), corrected for looking more than once; needs --order random.",
    ),
    min_chunks: int = typer.Option(
        16, "--min-chunks", help="With --target-ci: the first look, after this many windows (then 2x, 4x, ...)."
    ),
    generated: Optional[str] = typer.Option(
        None,
        "--generated",
        help="A corpus of `generate --endpoint` (the served model's own answers and their log-probs): "
        "KL(served‖base) from it and the base file of `base -f` over it, no model run (docs/endpoint.md).",
    ),
    depth_bins: Optional[str] = typer.Option(
        None,
        "--depth-bins",
        help="Print KLD by depth (the predicted token's position in its window) after the statistics: "
        "log2 buckets (log2; linear ones where the scored depths span fewer than 4) or bucket starts "
        "such as 1,4096,32768. The JSON has the table in any case.",
    ),
    engine_flags=None,
    bootstrap_flags=None,
    display=None,
):
    """Phase 2: run a model over a base file's tokens and print llama-perplexity's KLD statistics."""
    choose_progress(display.progress)
    if generated is not None:  # no model runs: nothing to load
        _served_audit(generated, base_file, model, engine_flags, (json_out, per_token), bootstrap_flags)
        return
    start_loading(engine_flags, model)
    from kldtool.cli.compare_flags import checkpoints_of, stopping_of
    from kldtool.pipeline.compare import compare_files
    from kldtool.pipeline.compare_job import CompareJob
    from kldtool.provenance.command_line import command_line
    from kldtool.stats.depth import parse_depth_bins

    del kl_divergence
    if base_file is None:
        raise UsageError("compare needs --kl-divergence-base FILE (written by `kldtool base` or llama-perplexity)")
    checkpoints = checkpoints_of(state, checkpoint_every, resume)
    resampling = bootstrap_of(bootstrap_flags)
    visit, stopping = stopping_of(order, target_ci, min_chunks)
    parse_depth_bins(depth_bins, 1, 1)  # a malformed spec fails before anything is opened
    if file is not None:
        print(f"note: -f {file} ignored: the tokens come from {base_file}", file=sys.stderr)
    job = CompareJob(
        base_path=base_file,
        engine=engine_options(engine_flags, model),
        force=force,
        json_path=json_out,
        per_token_path=per_token,
        chunks=chunks,
        chunk_range=chunk_range,
        noise_floor=noise_floor,
        head_from=head_from,
        protocol=(protocol, ctx_size, stride, lengths),
        checkpoints=checkpoints,
        bootstrap=resampling,
        order=visit,
        stopping=stopping,
        depth_bins=depth_bins,
        command_line=tuple(command_line()),
    )
    compare_files(job)


def _served_audit(generated, base_file, model, engine_flags, outputs, bootstrap_flags) -> None:
    if base_file is None:
        raise UsageError("compare --generated needs --kl-divergence-base FILE (of `base -f` over the corpus)")
    if model is not None or getattr(engine_flags, "endpoint", None):
        raise UsageError("compare --generated reads the served model's answers from the corpus: no -m or --endpoint")
    from kldtool.pipeline.served_audit import run_served_audit

    run_served_audit(generated, base_file, outputs[0], bootstrap_of(bootstrap_flags), outputs[1])


@app.command("noise-floor")
@flags(engine_flags=ENGINE, display=PROGRESS)
def noise_floor_cmd(
    base_file: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="The base file (its model is the default -m)."
    ),
    model: Optional[str] = typer.Option(
        None,
        "-m",
        "--model",
        help="The base model again (default: the one the base file names), run another valid way.",
    ),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the floor here (for compare --noise-floor)."),
    force: bool = typer.Option(
        False, "--force", help="Measure it even where the base file's llama.cpp backend (CPU, CUDA ...) is another."
    ),
    engine_flags=None,
    display=None,
):
    """The base model against its own base file through another numeric path (dtype, batch size,
    device or engine): the KLD below which a quant cannot be told from the base."""
    choose_progress(display.progress)
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.file_flags import parse_chunk_range
    from kldtool.pipeline.noise_floor import run_noise_floor

    if base_file is None:
        raise UsageError("noise-floor needs --kl-divergence-base FILE")
    reader = open_base_file(base_file)
    try:
        named = reader.metadata.get("model", {}).get("model")
        if model is None and not named:
            raise UsageError(f"noise-floor: {base_file} does not name its model; give -m")
        parse_chunk_range(None, chunks, reader.header.n_chunk, base_file)  # refused before the model loads
        eng = open_engine(engine_flags, model or named, reader.header.n_ctx)
        try:
            run_noise_floor(eng, reader, json_path=json_out, chunks=chunks, force=force)
        finally:
            eng.close()
    finally:
        reader.close()
