"""``kldtool sweep``: rank many quants against one base file, each scoring only the windows its
place in the ranking needs (pipeline/sweep.py)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kldtool.cli.app import app
from kldtool.cli.flag_groups import BOOTSTRAP, ENGINE, PROGRESS
from kldtool.cli.ray_flags import RAY, SHIP
from kldtool.cli.options import bootstrap_of, flags, open_engine
from kldtool.runtime.progress import choose as choose_progress
from kldtool.errors import KldError, UsageError


@app.command()
@flags(engine_flags=ENGINE, bootstrap_flags=BOOTSTRAP, display=PROGRESS, cluster=RAY | SHIP)
def sweep(
    base_file: Optional[str] = typer.Option(
        None, "--kl-divergence-base", help="Base file written by `kldtool base` or llama-perplexity."
    ),
    models: List[str] = typer.Option(
        [], "-m", "--model", help="A quant to rank (repeat: -m Q8_0.gguf -m Q4_K_M.gguf)."
    ),
    out_dir: Optional[str] = typer.Option(
        None, "-o", "--out", help="Directory of the sweep: each quant's state and result, sweep.json (rerun resumes)."
    ),
    order: str = typer.Option("random:0", "--order", help="random[:SEED]: the one order every quant visits."),
    target_ci: Optional[float] = typer.Option(
        None, "--target-ci", help="Also let a quant stop once its mean KLD is known to this fraction (0.02: ±2 %)."
    ),
    min_chunks: int = typer.Option(16, "--min-chunks", help="The first round's windows (then 2x, 4x, ... all)."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    markdown: Optional[str] = typer.Option(None, "--markdown", help="Also write the table as Markdown here."),
    force: bool = typer.Option(False, "--force", help="As compare's --force."),
    engine_flags=None,
    bootstrap_flags=None,
    display=None,
    cluster=None,
):
    """Rank quants against one base file in rounds of windows, in one random order, until each
    quant's place is settled: the report table with intervals and the windows each needed."""
    choose_progress(display.progress)
    from kldtool.cli.compare_flags import stopping_of
    from kldtool.pipeline.file_flags import parse_chunk_range
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.sweep import Sweep, quants_of

    if base_file is None or not models or out_dir is None:
        raise UsageError("sweep needs --kl-divergence-base FILE, -o DIR and at least one -m MODEL")
    visit, stopping = stopping_of(order, target_ci, min_chunks)
    if not visit.random:
        raise UsageError(f"--order {order}: a sweep stops quants early, so it needs random[:SEED]")
    resampling = bootstrap_of(bootstrap_flags)
    if resampling.resamples < 100:
        raise UsageError(f"--bootstrap {resampling.resamples}: the stopping rule needs at least 100 resamples")
    quants = quants_of(models, out_dir)
    reader = open_base_file(base_file)
    try:
        with _players(cluster, engine_flags, reader, quants) as players:
            sw = Sweep(
                reader=reader,
                quants=quants,
                players=players,
                order=visit,
                span=parse_chunk_range(None, chunks, reader.header.n_chunk, base_file),
                first=stopping.first,
                target=stopping.target,
                bootstrap=resampling,
                force=force,
            )
            log = sw.run()
    finally:
        reader.close()
    _print(log, sw, resampling, markdown)


def _players(cluster, engine_flags, reader, quants):
    """Who plays the rounds' turns: this process, or tasks on the Ray cluster --ray names."""
    import contextlib
    import functools

    from kldtool.cli.ray_flags import task_flags, task_shape
    from kldtool.pipeline.sweep_play import LocalPlayers

    shape = task_shape(cluster, ["--ship-base"] * cluster.ship_base)
    if shape is None:
        return contextlib.nullcontext(
            LocalPlayers(reader, lambda model: open_engine(engine_flags, model, reader.header.n_ctx))
        )
    from kldtool.cluster.ray_players import on_cluster

    engine_for = functools.partial(open_engine, task_flags(engine_flags, shape))
    return on_cluster(cluster.ray, shape, reader, cluster.ship_base, engine_for, quants)


def _print(log: dict, sw, spec, markdown: str | None) -> None:
    import os

    from kldtool.analysis.ordering import ordering
    from kldtool.analysis.results import load_results
    from kldtool.report import table
    from kldtool.report.sweep import sweep_lines
    from kldtool.runtime.small_files import write_text

    failed = log.get("failed", {})
    results = [q.result for q in sw.quants if q.label not in failed and os.path.exists(q.result)]
    rows = load_results(results) if results else []
    title = f"sweep of {len(rows)} quants, order {sw.order}"
    if rows:
        table.console(rows, title)
    lines = sweep_lines(log) + (ordering(rows, spec) if rows else [])
    print("\n".join(lines))
    if markdown:
        write_text(markdown, (table.markdown(rows, title) + "\n" if rows else "") + "\n".join(lines) + "\n")
    print(f"sweep: wrote {sw.log_path}", file=sys.stderr)
    if failed:
        raise KldError(f"sweep: {len(failed)} of {len(sw.quants)} quants failed: {', '.join(failed)} (see above)")
