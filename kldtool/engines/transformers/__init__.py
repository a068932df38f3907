"""The transformers engine (engine.py), a GGUF through transformers' loader with its repeated
work done once (gguf.py), and MoE routing through hooks on the routers (routing.py)."""
