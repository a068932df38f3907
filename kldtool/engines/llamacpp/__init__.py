"""The llama.cpp engine through llama-cpp-python (engine.py): its model loaded on a thread during
start-up (load.py), its KV-cache and flash-attention flags (attention.py), contexts side by side
(lanes.py) on pieces of batches with unchanged logits (pieces.py), MoE routing through its eval
callback (routing.py), and quantizing and editing GGUFs (gguf_tools.py)."""
