"""The llama.cpp engine's own flags (shown with ``--engine llamacpp --help``) and what they
become: contexts side by side, and the attention settings (attention.py checks those)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import typer

from kldtool.engines.llamacpp.attention import Attention
from kldtool.errors import UsageError

FLAGS = {
    "contexts": (
        Optional[int],
        typer.Option(
            None,
            "--contexts",
            help="llamacpp, compare and ppl: contexts decoding different batches at once, the threads split "
            "among them (default 2 with 2+ threads; 1 is llama-perplexity's layout). The numbers do not change.",
        ),
    ),
    "flash_attn": (
        Optional[str],
        typer.Option(
            None,
            "--flash-attn",
            help="llamacpp: auto (default, as llama-perplexity: on for this CPU), on or off (its -fa). "
            "Flash attention keeps parts of attention in f16: ~1e-4 nats of NLL.",
        ),
    ),
}


@dataclass(frozen=True)
class LlamaCppOptions:
    FLAGS: ClassVar[dict] = FLAGS
    contexts: int | None = None  # None: 2 with two threads or more
    attention: Attention = Attention()

    @classmethod
    def from_flags(cls, given: dict) -> "LlamaCppOptions":
        contexts = given.get("contexts")
        if contexts is not None and contexts < 1:
            raise UsageError(f"--contexts {contexts}: must be at least 1")
        return cls(contexts, Attention.from_flags(given.get("kv_cache_dtype"), given.get("flash_attn")))
