"""The llama.cpp engine through llama-cpp-python (engine.py): its model loaded on a thread during
start-up (load.py), its flags (options.py), its KV-cache and flash-attention settings
(attention.py), contexts side by side (lanes.py) on pieces of batches with unchanged logits
(pieces.py), MoE routing through its eval callback (routing.py), llama-quantize (quantize.py) and answers
sampled for kldtool generate (sampling.py)."""

from pathlib import Path

from kldtool.engines.contract import HIDDEN, ROUTING, SAMPLES, SCHEDULE
from kldtool.engines.registry import EngineEntry


def _is_gguf(model: str | None, gguf_file: str | None) -> bool:
    return model is None or bool(gguf_file) or Path(model).suffix.lower() == ".gguf"  # None: the built-in GGUF


ENTRIES = (
    EngineEntry(
        name="llamacpp",
        engine="kldtool.engines.llamacpp.engine:LlamaCppEngine",
        options="kldtool.engines.llamacpp.options:LlamaCppOptions",
        can=frozenset({HIDDEN, ROUTING, SCHEDULE, SAMPLES}),
        recognizes=_is_gguf,
    ),
)
