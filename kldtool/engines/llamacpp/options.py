"""The llama.cpp engine's own flags (shown with ``--engine llamacpp --help``) and what they
become: contexts side by side, the attention settings (attention.py checks those) and where
the layers go (offload.py, llama-perplexity's -ngl, -sm, -mg, -ts and -nkvo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import typer

from kldtool.engines.llamacpp.attention import Attention
from kldtool.engines.llamacpp.offload import Offload
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
    # llama-perplexity's offload flags, its short names too (offload.py).
    "n_gpu_layers": (
        Optional[str],
        typer.Option(
            None,
            "-ngl",
            "--n-gpu-layers",
            help="llamacpp: layers to put on the GPU, a number or all (default all: every layer a GPU build "
            "can take; a CPU build runs on the CPU whatever this says).",
        ),
    ),
    "split_mode": (
        Optional[str],
        typer.Option(
            None,
            "-sm",
            "--split-mode",
            help="llamacpp: how several GPUs share the model: none (one GPU, -mg), layer (default) or row, tensor.",
        ),
    ),
    "main_gpu": (
        Optional[int],
        typer.Option(None, "-mg", "--main-gpu", help="llamacpp: the GPU for the whole model (-sm none) (default 0)."),
    ),
    "tensor_split": (
        Optional[str],
        typer.Option(
            None, "-ts", "--tensor-split", help="llamacpp: each GPU's share of the model, as proportions: 3,1."
        ),
    ),
    "no_kv_offload": (
        bool,
        typer.Option(False, "-nkvo", "--no-kv-offload", help="llamacpp: keep the KV cache (and attention) on the CPU."),
    ),
}


@dataclass(frozen=True)
class LlamaCppOptions:
    FLAGS: ClassVar[dict] = FLAGS
    ALSO_TAKES: ClassVar[tuple] = ("kv_cache_dtype",)  # vLLM's flag, for llama.cpp's cache types too
    REFUSAL_NOTES: ClassVar[tuple] = (("contexts", " (the {engine} engine spreads one batch over its device itself)"),)
    PRELOAD: ClassVar[str] = "kldtool.engines.llamacpp.load"  # the GGUF loaded on a thread during start-up
    contexts: int | None = None  # None: 2 with two threads or more
    attention: Attention = Attention()
    offload: Offload = Offload()

    @classmethod
    def from_flags(cls, flags: dict) -> "LlamaCppOptions":
        contexts = flags.get("contexts")
        if contexts is not None and contexts < 1:
            raise UsageError(f"--contexts {contexts}: must be at least 1")
        attention = Attention.from_flags(flags.get("kv_cache_dtype"), flags.get("flash_attn"))
        return cls(contexts, attention, Offload.from_flags(flags))
