"""llama.cpp's attention settings, as llama-perplexity takes them: the K and V cache type (its
-ctk/-ctv, f16 by default) and flash attention (its -fa, auto by default: on, on the CPU).

With flash attention on, attention runs partly in f16 whatever the cache type: ~2.7e-4 nats of
NLL from transformers' fp32 on the 128k test model; 1.2e-4 (half the base file's grid step)
with it off."""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.engines.llamacpp.tensor_types import ggml_number
from kldtool.errors import UsageError

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLOAT_CACHES = ("f32", "f16", "bf16")
FLASH_ATTN = {"auto": "AUTO", "on": "ENABLED", "off": "DISABLED"}


@dataclass(frozen=True)
class Attention:
    kv_cache: str | None = None  # None: llama.cpp's default, f16
    flash_attn: str = "auto"

    @classmethod
    def from_flags(cls, kv_cache: str | None, flash_attn: str | None) -> "Attention":
        """``--kv-cache-dtype`` and ``--flash-attn``, checked (a one-line usage error)."""
        if kv_cache is not None and kv_cache.lower() not in KV_CACHE_TYPES:
            raise UsageError(f"--kv-cache-dtype {kv_cache}: for --engine llamacpp, one of {', '.join(KV_CACHE_TYPES)}")
        if flash_attn is not None and flash_attn.lower() not in FLASH_ATTN:
            raise UsageError(f"--flash-attn {flash_attn}: auto, on or off")
        kv, fa = kv_cache and kv_cache.lower(), (flash_attn or "auto").lower()
        if kv and kv not in FLOAT_CACHES and fa == "off":
            raise UsageError(
                f"--kv-cache-dtype {kv}: llama.cpp quantizes the V cache only with --flash-attn on or auto"
            )
        return cls(kv, fa)

    def apply(self, cp, lib) -> None:
        """Set them on llama.cpp's context parameters ``cp``."""
        cp.flash_attn_type = getattr(lib, f"LLAMA_FLASH_ATTN_TYPE_{FLASH_ATTN[self.flash_attn]}")
        if self.kv_cache:  # one of KV_CACHE_TYPES, every one a ggml type
            cp.type_k = cp.type_v = ggml_number(lib, self.kv_cache)
