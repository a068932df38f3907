"""The endpoint engine's own flags (shown with ``--endpoint URL --help``) and what they become."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import typer

from kldtool.engines.endpoint.client import TIMEOUT_S
from kldtool.engines.endpoint.forms import APIS, SAMPLING_APIS
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
            "sglang (/generate), openai-echo (echo + logprobs), or auto (default: tried in that order); "
            "generate: chat or completions (default: chat for chat prompts).",
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
    "endpoint_timeout": (
        Optional[float],
        typer.Option(
            None,
            "--endpoint-timeout",
            min=0.1,
            help=f"--endpoint: seconds a request may take in all, its retries included (default {TIMEOUT_S:g}).",
        ),
    ),
    "endpoint_follow_redirects": (
        bool,
        typer.Option(
            False,
            "--endpoint-follow-redirects",
            help="--endpoint: follow a server's redirects (the key still goes only to its own origin, never "
            "from https to http).",
        ),
    ),
}


@dataclass(kw_only=True, frozen=True)
class EndpointOptions:
    FLAGS: ClassVar[dict] = FLAGS
    url: str = ""
    model: str | None = None  # the served model's name (None: the first listed)
    api: str = "auto"
    top_k: int | None = None  # None: the most the server allows
    concurrency: int = 4
    timeout: float = TIMEOUT_S  # a request's deadline, retries included
    follow_redirects: bool = False
    sampling: bool = False  # generate's: the server's sampled answers, not its prompt log-probs

    @classmethod
    def from_flags(cls, flags: dict) -> "EndpointOptions":
        api = flags.get("endpoint_api") or "auto"
        if api not in (*APIS, *SAMPLING_APIS, "auto"):
            raise UsageError(f"--endpoint-api {api}: one of {', '.join(APIS)}, auto (generate: chat, completions)")
        concurrency = flags.get("concurrency")
        return cls(
            url=flags["endpoint"],
            model=flags.get("endpoint_model"),
            api=api,
            top_k=flags.get("top_k"),
            concurrency=concurrency or 4,
            timeout=flags.get("endpoint_timeout") or TIMEOUT_S,
            follow_redirects=bool(flags.get("endpoint_follow_redirects")),
        )
