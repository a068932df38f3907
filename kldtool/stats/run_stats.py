"""Every statistic of a compare run as one JSON-ready dict: llama.cpp's, the KLD histogram,
kldtool's extra metrics and the block bootstrap."""

from __future__ import annotations

from kldtool.stats.accumulator import KldAccumulator
from kldtool.stats.bootstrap import Bootstrap, block_bootstrap
from kldtool.stats.depth import depth_table
from kldtool.stats.extra import extra_stats, outside_mass
from kldtool.stats.histogram import kld_histogram
from kldtool.stats.summary import MIN_TOKENS_FOR_STATS, KldSummary, summarize


# The exact KLD of a top-K comparison lies within [lower bound, lower bound + this many times
# the tail estimate]: an empirical allowance (docs/metrics.md has the measurements), not a theorem.
TAIL_ALLOWANCE = 1.5


def statistics(
    acc: KldAccumulator, bootstrap: Bootstrap, keep: int | None = None, endpoint: dict | None = None
) -> tuple[KldSummary, dict]:
    """(llama.cpp's summary, the whole statistics dict); below ``MIN_TOKENS_FOR_STATS``
    tokens only the running values, as llama.cpp prints nothing more. ``keep``: the base
    file held top-K records, so the KLD is the one-bucket lower bound. ``endpoint``: the
    compared model was known by its top-K log-probs (engines/endpoint); what that engine says
    of its run, completed here from the sums (P_out, the tail estimate)."""
    full = acc.count >= MIN_TOKENS_FOR_STATS
    summary = summarize(acc, with_quantiles=full)
    stats = summary.as_dict()
    if full:
        stats["kld_histogram"] = kld_histogram(acc.values()[0])
        stats["extra"] = extra_stats(acc, summary.same_top)
        stats["bootstrap"] = block_bootstrap(acc.chunk_vectors, bootstrap)
        if acc.depth_bounds is not None:
            stats["depth"] = depth_table(acc.depth_bounds, acc.depth_blocks, bootstrap)
    if keep and acc.count:
        lower, tail = summary.kld_mean[0], acc.sums["kld_tail"] / acc.count
        stats["compact_base"] = {
            "keep": keep,
            "kld_mean_lower_bound": lower,
            "tail_estimate": tail,
            "kld_mean_estimate": lower + tail,
            "bound": TAIL_ALLOWANCE * tail,
            "allowance": TAIL_ALLOWANCE,
            "p_out": outside_mass(acc),
        }
    if endpoint is not None:
        lower, tail = summary.kld_mean[0], (acc.sums["kld_tail"] / acc.count if acc.count else 0.0)
        out = outside_mass(acc)
        stats["endpoint"] = endpoint | {
            "kld_mean_lower_bound": lower,
            "tail_estimate": tail,
            "kld_mean_estimate": lower + tail,
            "p_out_mean": out["mean"],
            "p_out_99": out["p99"],
        }
    return summary, stats
