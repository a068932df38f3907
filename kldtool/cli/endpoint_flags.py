"""The endpoint engine's flags (engines/endpoint), in the ENGINE group every run command shows."""

from __future__ import annotations

from typing import Optional

import typer

ENDPOINT = {
    "endpoint": (
        Optional[str],
        typer.Option(
            None,
            "--endpoint",
            help="compare against any OpenAI-compatible server (URL) that returns prompt log-probs, "
            "no plugin: PPL, Δp and same top exact, KLD a lower bound (docs/endpoint.md); key from "
            "KLDTOOL_ENDPOINT_KEY or OPENAI_API_KEY.",
        ),
    ),
    "endpoint_model": (
        Optional[str],
        typer.Option(None, "--endpoint-model", help="--endpoint: the served model's name (default: the first listed)."),
    ),
    "endpoint_api": (
        Optional[str],
        typer.Option(
            None,
            "--endpoint-api",
            help="--endpoint: the form the server returns prompt log-probs in: vllm (prompt_logprobs), "
            "sglang (/generate), openai-echo (echo + logprobs), or auto (default: tried in that order).",
        ),
    ),
    "top_k": (
        Optional[int],
        typer.Option(
            None,
            "--top-k",
            min=1,
            help="--endpoint: log-probs asked per position (default: the most the server allows).",
        ),
    ),
    "concurrency": (
        Optional[int],
        typer.Option(None, "--concurrency", min=1, help="--endpoint: requests in flight at once (default 4)."),
    ),
}
