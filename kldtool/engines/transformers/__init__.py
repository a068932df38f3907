"""The transformers engine (engine.py): any checkpoint transformers loads, a GGUF through its
loader with the repeated parsing done once (engines/hf_gguf.py), MoE routing through forward hooks on the
routers (routing.py), and answers sampled for kldtool generate (sampling.py)."""

from kldtool.engines.contract import HIDDEN, ROUTING, SAMPLES
from kldtool.engines.registry import EngineEntry

ENTRIES = (
    EngineEntry(
        name="transformers",
        engine="kldtool.engines.transformers.engine:TransformersEngine",
        can=frozenset({HIDDEN, ROUTING, SAMPLES}),
        default=True,
    ),
)
