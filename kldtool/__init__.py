"""kldtool: measure how far a quantized LLM's predictions drift from its base model."""

__version__ = "0.1.0"
