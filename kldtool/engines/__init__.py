"""Engines behind one interface (see base.Engine); chosen by name or by the model path."""

from __future__ import annotations

from pathlib import Path

from kldtool.engines.base import Engine
from kldtool.errors import UsageError

ENGINES = ("transformers", "llamacpp")


def guess_engine(model: str | None) -> str:
    if model is None or Path(model).suffix.lower() == ".gguf":
        return "llamacpp"
    return "transformers"


def make_engine(engine: str | None, model: str | None, dtype: str | None = None, device: str | None = None,
                threads: int | None = None, batch_tokens: int = 2048) -> Engine:
    """Build an engine; with no model, the built-in default model in the engine's format."""
    from kldtool.engines import defaults

    engine = engine or guess_engine(model)
    if engine == "llamacpp":
        from kldtool.engines.llamacpp import LlamaCppEngine

        if dtype not in (None, "gguf"):
            raise UsageError(f"--dtype {dtype}: the llamacpp engine runs the GGUF's own types; drop --dtype")
        if device not in (None, "cpu"):
            raise UsageError(f"--device {device}: this llamacpp engine build runs on the CPU")
        return LlamaCppEngine(model or defaults.default_gguf(), threads=threads, batch_tokens=batch_tokens)
    if engine == "transformers":
        from kldtool.engines.transformers import TransformersEngine

        return TransformersEngine(model or defaults.default_transformers_model(), dtype=dtype or "float32",
                                  device=device or "cpu", threads=threads, batch_tokens=batch_tokens)
    raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")


__all__ = ["Engine", "ENGINES", "guess_engine", "make_engine"]
