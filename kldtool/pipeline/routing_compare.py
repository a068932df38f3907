"""compare's side of MoE routing: where the base file stores routing and the engine reads its
own routers, each window's two routings are compared as its records come (routing/stats.py)."""

from __future__ import annotations

from kldtool.engines.contract import ROUTING
from kldtool.engines.registry import named_with
from kldtool.errors import StateError
from kldtool.pipeline.engine_modes import record_routing, routing_shape
from kldtool.report.routing import routing_lines
from kldtool.routing.section import RoutingReader
from kldtool.routing.stats import RoutingStats


class CompareRouting:
    def __init__(self, stored: RoutingReader, tap, per_token=None, state=None):
        self.stored, self.tap = stored, tap
        self.stats = resumed_stats(stored.shape, state)
        self.columns = None
        if per_token:  # the per-token file's routing columns (analysis/per_token_routing.py)
            per_token.with_routing(stored.shape.layers)
            self.columns = per_token.routing

    def add(self, window, records) -> None:
        first, changed = self.stats.add(self.stored.chunk(window.index), self.tap.pop(window.index), records.kld)
        if self.columns:
            self.columns.add(first, changed)

    def report(self, sinks, bootstrap) -> dict | None:
        if not self.stats.positions:
            return None
        summary = self.stats.summary(bootstrap)
        for line in routing_lines(summary):
            sinks.line(line)
        return summary


def resumed_stats(shape, state) -> RoutingStats:
    """The routing rows a checkpoint holds (``state``: analysis/state_file.py's RunState, or None),
    the windows it scored without them counted as skipped."""
    rows = None if state is None else state.routing
    visited = 0 if state is None else state.visited
    width = RoutingStats(shape).width
    if rows is not None and rows.shape[1:] != (width,):
        raise StateError(f"the checkpoint's routing rows are {rows.shape[1:]} wide; this base file's need {width}")
    return RoutingStats(shape, rows, skipped=visited - (0 if rows is None else len(rows)))


def compare_routing(engine, reader, sinks, state=None, per_token=None) -> CompareRouting | None:
    """The comparison where both sides have routing, else None (and a note where only the file has)."""
    stored = RoutingReader(reader)
    if stored.shape is None:
        return None
    shape, s = routing_shape(engine), stored.shape
    if shape is None:
        sinks.info(
            f"compare: the base file stores MoE routing; the {engine.facts.name} engine does not read routers "
            f"({named_with(ROUTING)} do), so routing is not compared"
        )
        return None
    if (shape.layers, shape.k, shape.n_experts) != (s.layers, s.k, s.n_experts):
        sinks.info(
            f"compare: not comparing routing: the base file's routers ({len(s.layers)} layers, {s.k} of "
            f"{s.n_experts} experts) are not the model's ({len(shape.layers)} layers, {shape.k} of {shape.n_experts})"
        )
        return None
    routing = CompareRouting(stored, record_routing(engine), per_token, state)
    if routing.stats.skipped:
        sinks.info(
            f"compare: the checkpoint's first {routing.stats.skipped} windows were scored without routing; "
            f"routing is compared over the rest"
        )
    return routing
