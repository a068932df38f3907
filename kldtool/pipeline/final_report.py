"""What a compare run prints after its chunk lines, and its chunk lines again: llama.cpp's three
statistic blocks and kldtool's extra block (compare, merge), and a checkpoint's chunks replayed
line by line as the run printed them (resume, merge)."""

from __future__ import annotations

from kldtool.pipeline.sinks import Sinks
from kldtool.report.console import chunk_line, extra_block, final_blocks
from kldtool.report.depth import depth_lines
from kldtool.stats import KldAccumulator, summarize
from kldtool.stats.bootstrap import Bootstrap
from kldtool.stats.by_label import by_label_line, kld_by_label
from kldtool.stats.run_stats import statistics
from kldtool.stats.summary import MIN_TOKENS_FOR_STATS


def replay(source: KldAccumulator, sinks: Sinks) -> KldAccumulator:
    """Add ``source``'s chunks again one by one, printing each running line as the run did."""
    acc = KldAccumulator(source.depth_bounds)
    for chunk, vector, values, depth in source.iter_chunks():
        acc.add_chunk(chunk, vector, values, depth)
        sinks.line(chunk_line(chunk + 1, summarize(acc, with_quantiles=False)))
    return acc


def final_report(
    acc: KldAccumulator,
    sinks: Sinks,
    warnings: list[str],
    bootstrap: Bootstrap = Bootstrap(),
    keep: int | None = None,
    noise_floor: dict | None = None,
    endpoint: dict | None = None,
    show_depth: bool = False,
    depth_origin: str = "window",
    finish: list[str] | None = None,
) -> dict:
    """llama.cpp's three statistic blocks, kldtool's extra block, with ``show_depth`` the depth
    table (and any --force warning again), returning the statistics. ``endpoint``: what a run
    from a server's top-K log-probs knows only as a bound (engines/endpoint). ``finish``: each
    window's finish reason (a generated corpus's answers), for the mean KLD by it."""
    sinks.line()
    summary, stats = statistics(acc, bootstrap, keep, endpoint)
    if noise_floor and acc.count:
        stats["noise_floor"] = noise_floor | {
            "multiple": (summary.kld_mean[0] / noise_floor["kld_mean"] if noise_floor["kld_mean"] > 0 else float("inf"))
        }
    if acc.count >= MIN_TOKENS_FOR_STATS:
        shown = depth_lines(stats.get("depth"), bool(endpoint), depth_origin) if show_depth else []
        for line in final_blocks(summary, "KLD ≥" if endpoint else "KLD") + extra_block(stats) + shown:
            sinks.line(line)
    else:
        sinks.info(
            f"compare: only {acc.count} tokens scored (< {MIN_TOKENS_FOR_STATS}); no final statistics, as llama.cpp"
        )
    if finish and acc.count:
        stats["by_finish"] = kld_by_label(acc, finish)
        sinks.line(by_label_line("Mean KLD by how the answer ended", stats["by_finish"]))
    for w in warnings:
        sinks.line("warning: " + w)
    return stats
