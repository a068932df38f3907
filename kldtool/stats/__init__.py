"""Streaming, mergeable accumulators and llama.cpp's summary formulas."""

from kldtool.stats.accumulator import KldAccumulator, PplAccumulator
from kldtool.stats.summary import KldSummary, summarize

__all__ = ["KldAccumulator", "PplAccumulator", "KldSummary", "summarize"]
