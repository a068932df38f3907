"""``base --routing``: a mixture of experts' routing stored beside the rows (routing/section.py),
on by default where the engine reads the model's routers and the file has room for it."""

from __future__ import annotations

from kldtool.engines.contract import ROUTING
from kldtool.engines.registry import named_with
from kldtool.errors import UsageError
from kldtool.logitsfile.header import CONTAINER
from kldtool.pipeline.engine_modes import record_routing, routing_shape
from kldtool.routing.section import RoutingSection


def base_routing(engine, wanted: bool | None, fmt: str, out_path, resume: bool, header):
    """(the section the writer stores, the engine's recorder), or None: ``wanted`` is --routing
    (True), --no-routing (False) or neither (None: on for a MoE model written to a container)."""
    if wanted is False or not out_path:
        return None
    shape = routing_shape(engine)
    if wanted is None and (shape is None or fmt != CONTAINER or resume):
        return None
    if fmt != CONTAINER:
        raise UsageError("--routing: llama.cpp's raw layout has no room for routing; use --format kldtool")
    if resume:
        raise UsageError("--routing with --resume: a resumed base run does not keep routing yet; add --no-routing")
    if shape is None:  # a dense model, or an engine that reads no routers
        raise UsageError(
            f"--routing: the {engine.facts.name} engine reads no mixture-of-experts routers in "
            f"{engine.facts.model} ({named_with(ROUTING)} read a mixture's routers)"
        )
    return RoutingSection(shape, header.rows_of), record_routing(engine)


def routed_blocks(blocks, group, section: RoutingSection, tap):
    """``blocks`` as they come, each window's routing filed once its last block is through."""
    current = None
    for i, rows, nll in blocks:
        if current is not None and i != current:
            section.add(group[current].index, tap.pop(group[current].index))
        current = i
        yield i, rows, nll
    if current is not None:
        section.add(group[current].index, tap.pop(group[current].index))
