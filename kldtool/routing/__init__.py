"""Mixture-of-experts routing: which experts each router chose at each scored position, stored
in the base file (section.py), caught from an engine's own routers at compare time, and compared
(stats.py); docs/metrics.md says what the statistics mean."""

from kldtool.routing.rows import Routed, RouterShape

__all__ = ["Routed", "RouterShape"]
