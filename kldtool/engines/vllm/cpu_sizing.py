"""How much host memory vLLM gets for its KV cache on a CPU-only machine.

Left to itself, vLLM-CPU takes a fraction of the host's memory (``gpu_memory_utilization``),
profiles a dummy forward of ``max_num_batched_tokens`` tokens and fills that fraction with KV
blocks: gigabytes and seconds of start-up on a small machine, for a scoring run whose windows
need a few hundred MB. kldtool knows the run's shape (windows per ``generate`` call, the window
length), so it asks for a KV cache of that size; vLLM then skips the profile and allocates
only that. With ``max_tokens=1`` a window holds its blocks for one prefill and one step, so
the cache needs what a few scheduler steps prefill, not every window of a ``generate`` call;
a window that finds no room waits (or is preempted and recomputed: the hook counts its
positions once). On a GPU vLLM's own profiler stays in charge.
"""

from __future__ import annotations

import json
import os

_BLOCK_TOKENS = 128  # vLLM-CPU's KV block
_STEPS = 4  # scheduler steps' worth of prefill tokens the cache holds
_DEFAULT_STEP_TOKENS = 4096  # vLLM-CPU's max_num_batched_tokens
# vLLM-CPU holds about half the tokens the bare K and V bytes would give (docs/benchmarks.md,
# the figures behind the code).
_HEADROOM = 2.0
_FLOOR = 64 << 20
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_bytes_per_token(model_dir: str, dtype: str) -> int | None:
    """Key and value bytes per token over all layers, from the checkpoint's config.json (a
    standard decoder's heads; None when the config does not say, e.g. a GGUF or a hub id)."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    try:
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        layers = int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    name = dtype if dtype != "auto" else str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(name.replace("torch.", ""), 4)


def kv_cache_bytes(
    model_dir: str, dtype: str, max_model_len: int | None, budget: int, step_tokens: int | None = None
) -> int | None:
    """The KV cache for windows of up to ``max_model_len`` tokens scheduled ``step_tokens`` at
    a time: a few steps' tokens and at least two whole windows, each rounded up to whole blocks;
    None (vLLM sizes it) when unknown or larger than ``budget``."""
    per_token = kv_bytes_per_token(model_dir, dtype)
    if not per_token or not max_model_len:
        return None
    window = -(-(max_model_len + 1) // _BLOCK_TOKENS) * _BLOCK_TOKENS
    tokens = max(_STEPS * (step_tokens or _DEFAULT_STEP_TOKENS), 2 * window) + window
    need = max(_FLOOR, int(tokens * per_token * _HEADROOM))
    return need if need < budget else None


def host_budget(utilization: float) -> int:
    """The host memory vLLM-CPU's ``gpu_memory_utilization`` would give it."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * utilization)
