"""The endpoint engine's own flags (shown with ``--endpoint URL --help``) and what they become."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import typer

from kldtool.engines.endpoint.forms import APIS
from kldtool.errors import UsageError

FLAGS = {
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


@dataclass(frozen=True)
class EndpointOptions:
    FLAGS: ClassVar[dict] = FLAGS
    url: str = ""
    model: str | None = None  # the served model's name (None: the first listed)
    api: str = "auto"
    top_k: int | None = None  # None: the most the server allows
    concurrency: int = 4

    @classmethod
    def from_flags(cls, given: dict) -> "EndpointOptions":
        api = given.get("endpoint_api") or "auto"
        if api not in (*APIS, "auto"):
            raise UsageError(f"--endpoint-api {api}: one of {', '.join(APIS)}, auto")
        concurrency = given.get("concurrency")
        return cls(given["endpoint"], given.get("endpoint_model"), api, given.get("top_k"), concurrency or 4)
