"""Engines by name (``REGISTRY``); each class builds itself from the options and owns its flag
checks (``Engine.from_options``), behind the interface in base.py. The package stays light:
a class is imported only when its engine is built (start_loading runs before numpy is)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from kldtool.provenance import model_ref
from kldtool.errors import EngineError, UsageError

ENGINES = ("transformers", "llamacpp", "vllm", "python", "xlstm")  # what --engine takes
REGISTRY = {
    "transformers": "kldtool.engines.transformers.engine:TransformersEngine",
    "llamacpp": "kldtool.engines.llamacpp.engine:LlamaCppEngine",
    "vllm": "kldtool.engines.vllm.offline:VllmEngine",
    "python": "kldtool.engines.python.engine:PythonEngine",
    "xlstm": "kldtool.engines.xlstm.engine:XlstmEngine",  # helibrunna runs
    "vllm-server": "kldtool.engines.vllm.served:VllmServerEngine",  # --server URL
    "endpoint": "kldtool.engines.endpoint.engine:EndpointEngine",  # --endpoint URL
}


@dataclass
class EngineOptions:
    engine: str | None = None
    model: str | None = None
    dtype: str | None = None
    device: str | None = None
    threads: int | None = None
    batch_tokens: int = 2048
    vllm: dict = field(default_factory=dict)  # to vllm.LLM(...), but max_model_len and logits_block
    server: str | None = None  # a running vLLM server's URL
    exchange_dir: str | None = None
    contexts: int | None = None  # llamacpp: contexts decoding side by side
    revision: str | None = None  # a hub id's branch, tag or commit
    gguf_file: str | None = None  # a GGUF inside the hub repository -m names
    flash_attn: str | None = None  # llamacpp: auto, on or off
    endpoint: str | None = None  # any OpenAI-compatible server's URL
    endpoint_model: str | None = None
    endpoint_api: str | None = None  # vllm, openai-echo or auto
    top_k: int | None = None  # endpoint: log-probs per position
    concurrency: int | None = None  # endpoint: requests in flight (default 4)


def guess_engine(model: str | None, gguf_file: str | None = None) -> str:
    if model is None or gguf_file or Path(model).suffix.lower() == ".gguf":
        return "llamacpp"
    if ":" in model and not Path(model).exists():  # package.module:factory
        return "python"
    from kldtool.engines.xlstm import helibrunna

    if helibrunna.looks_like(model):
        return "xlstm"
    return "transformers"


def engine_name(opts: EngineOptions) -> str:
    """The engine ``opts`` ask for: an endpoint means the endpoint client, a server or exchange
    directory vLLM's client, else the named engine, else the one the model path suggests."""
    if opts.endpoint:
        if opts.server or opts.exchange_dir or opts.engine:
            raise UsageError("--endpoint: a server of its own; not with --server, --exchange-dir or --engine")
        return "endpoint"
    return (
        "vllm-server" if opts.server or opts.exchange_dir else opts.engine or guess_engine(opts.model, opts.gguf_file)
    )


def start_loading(opts: EngineOptions) -> None:
    """Begin loading the model of a llamacpp engine on a thread (engines/llamacpp/load.py), so
    that it overlaps the command's start-up; make_engine's engine takes it. Nothing for others."""
    if engine_name(opts) == "llamacpp":
        from kldtool.engines import defaults
        from kldtool.engines.llamacpp import load as llamacpp_load

        try:
            ref = _model_ref(opts)
            llamacpp_load.start(ref.path if ref else defaults.default_gguf())
        except (EngineError, UsageError):  # make_engine reports it, after the command's own checks
            pass


def _model_ref(opts: EngineOptions) -> model_ref.ModelRef | None:
    """Where the model ``opts`` name is on this machine (a hub id resolved); None: the default."""
    if opts.model is None:
        if opts.revision or opts.gguf_file:
            raise UsageError(f"--{'revision' if opts.revision else 'gguf-file'}: only with -m naming a hub id")
        return None
    return model_ref.resolve(opts.model, opts.revision, opts.gguf_file)


def make_engine(opts: EngineOptions, n_ctx: int):
    """Build an engine for windows of ``n_ctx`` tokens (0: as long as the model's context, which
    the engine reads itself); with no model, the built-in default."""
    name = engine_name(opts)
    if name not in REGISTRY:
        raise UsageError(f"--engine {name!r}: expected one of {', '.join(ENGINES)}")
    endpoint_only = [
        f
        for f, v in (
            ("--endpoint-model", opts.endpoint_model),
            ("--endpoint-api", opts.endpoint_api),
            ("--top-k", opts.top_k),
        )
        if v
    ]
    endpoint_only += ["--concurrency"] if opts.concurrency is not None else []
    if endpoint_only and name != "endpoint":
        raise UsageError(f"{', '.join(endpoint_only)}: only with --endpoint URL")
    module, _, cls_name = REGISTRY[name].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    if opts.contexts is not None and not cls.takes_contexts:
        raise UsageError(
            f"--contexts {opts.contexts}: only for --engine llamacpp (the {cls.name} engine spreads "
            f"one batch over its device itself)"
        )
    if opts.flash_attn is not None and not cls.takes_attention_flags:
        raise UsageError(f"--flash-attn {opts.flash_attn}: only for --engine llamacpp")
    vllm_only = [k for k in opts.vllm if not (k == "kv_cache_dtype" and cls.takes_attention_flags)]
    if vllm_only and not cls.takes_vllm_args:
        also = " or llamacpp" if vllm_only == ["kv_cache_dtype"] else ""
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in vllm_only)}: only for --engine vllm{also}")
    if name == "python":  # a factory's spec names code, not weights
        return cls.from_options(opts, n_ctx)
    ref = _model_ref(opts)
    engine = cls.from_options(replace(opts, model=ref.path if ref else None), n_ctx)
    if name in ("vllm-server", "endpoint"):  # -m names only the tokenizer; the server's model is its own
        return engine
    if ref is None:  # the built-in default: recorded by the path the engine chose
        default = engine.describe().get("model")
        ref = model_ref.ModelRef(default, default) if default and os.path.exists(default) else None
    engine.source = ref.record() if ref else None
    return engine


__all__ = ["EngineOptions", "ENGINES", "REGISTRY", "engine_name", "guess_engine", "make_engine", "start_loading"]
