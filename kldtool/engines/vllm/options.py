"""The vLLM engines' own flags and what they become: the offline engine's arguments to
``vllm.LLM(...)`` (shown with ``--engine vllm --help``), and the served client's server and
exchange directory (``--server URL --help``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Optional

import typer

from kldtool.errors import UsageError

FLAGS = {
    "tensor_parallel_size": (
        Optional[int],
        typer.Option(None, "--tensor-parallel-size", help="vLLM: tensor-parallel ranks."),
    ),
    "pipeline_parallel_size": (
        Optional[int],
        typer.Option(None, "--pipeline-parallel-size", help="vLLM: pipeline stages (the last computes logits)."),
    ),
    "gpu_memory_utilization": (
        Optional[float],
        typer.Option(None, "--gpu-memory-utilization", help="vLLM: memory share it may reserve (CPU default 0.3)."),
    ),
    "max_model_len": (
        Optional[int],
        typer.Option(None, "--max-model-len", help="vLLM: context length (default: the window + 1)."),
    ),
    "quantization": (
        Optional[str],
        typer.Option(None, "--quantization", help="vLLM: quantization method (default: from the checkpoint)."),
    ),
    "kv_cache_dtype": (
        Optional[str],
        typer.Option(
            None,
            "--kv-cache-dtype",
            help="vLLM: KV-cache dtype (its names). llamacpp: K and V cache type, f16 (default, as "
            "llama-perplexity), f32, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0 or q5_1 (its -ctk/-ctv).",
        ),
    ),
    "logits_block": (
        Optional[int],
        typer.Option(
            None,
            "--logits-block",
            min=1,
            help="vLLM: scored rows whose logits the hook computes at once "
            "(default: 256 MiB of them, e.g. 682 rows of a 49k vocab).",
        ),
    ),
    "enforce_eager": (bool, typer.Option(False, "--enforce-eager", help="vLLM: no CUDA graphs / compilation.")),
    "trust_remote_code": (bool, typer.Option(False, "--trust-remote-code", help="vLLM: allow the model's own code.")),
    "vllm_arg": (
        Optional[list[str]],
        typer.Option(None, "--vllm-arg", help="vLLM: any other LLM(...) argument, KEY=VALUE (repeatable)."),
    ),
}
SERVED_FLAGS = {
    "server": (
        Optional[str],
        typer.Option(
            None,
            "--server",
            help="vLLM: score on a running `vllm serve` (URL) started with KLDTOOL_VLLM_HOOK=1; -m then names "
            "its tokenizer's directory if the server's is not here.",
        ),
    ),
    "exchange_dir": (
        Optional[str],
        typer.Option(
            None,
            "--exchange-dir",
            help="--server: a directory the server's workers write results to and this machine reads "
            "(default: a temporary one, for a server on this machine).",
        ),
    ),
}
# The flags that become LLM(...) arguments (--vllm-arg adds any other).
LLM_ARGS = tuple(k for k in FLAGS if k != "vllm_arg")


def parse_vllm_args(pairs: list[str]) -> dict:
    """``--vllm-arg KEY=VALUE`` pairs; values parse as JSON when they can (numbers, true, {...})."""
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise UsageError(f"--vllm-arg {p!r}: expected KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


@dataclass(frozen=True)
class VllmOptions:
    FLAGS: ClassVar[dict] = FLAGS
    llm_args: Mapping[str, object] = field(default_factory=dict)  # to LLM(...), as the user set them
    max_model_len: int | None = None  # None: the window + 1
    logits_block: int | None = None  # None: 256 MiB of logits

    @classmethod
    def from_flags(cls, flags: dict) -> "VllmOptions":
        # Only what the user set reaches vLLM; an unset switch is False.
        args = {k: v for k in LLM_ARGS if (v := flags.get(k)) is not None and v is not False}
        args.update(parse_vllm_args(flags.get("vllm_arg") or []))
        return cls(args, args.pop("max_model_len", None), args.pop("logits_block", None))


@dataclass(frozen=True)
class ServedOptions:
    FLAGS: ClassVar[dict] = SERVED_FLAGS
    ALSO_TAKES: ClassVar[tuple] = ("logits_block",)  # the offline engine's flag: the client's blocks
    server: str | None = None
    exchange_dir: str | None = None
    logits_block: int | None = None

    @classmethod
    def from_flags(cls, flags: dict) -> "ServedOptions":
        if not flags.get("server"):
            raise UsageError("--exchange-dir: only with --server URL")
        return cls(flags["server"], flags.get("exchange_dir"), flags.get("logits_block"))
