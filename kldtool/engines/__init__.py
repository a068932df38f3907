"""Engines behind one interface (see base.Engine); chosen by name or by the model path."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kldtool.errors import EngineError, UsageError

if TYPE_CHECKING:  # the package stays light: start_loading runs before numpy is imported
    from kldtool.engines.base import Engine

ENGINES = ("transformers", "llamacpp", "vllm", "python")


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


def guess_engine(model: str | None) -> str:
    if model is None or Path(model).suffix.lower() == ".gguf":
        return "llamacpp"
    if ":" in model and not Path(model).exists():  # package.module:factory
        return "python"
    return "transformers"


def engine_name(opts: EngineOptions) -> str:
    """The engine ``opts`` ask for: a server or exchange directory means vLLM's client, else the
    named engine, else the one the model path suggests."""
    return "vllm" if opts.server or opts.exchange_dir else opts.engine or guess_engine(opts.model)


def start_loading(opts: EngineOptions) -> None:
    """Begin loading the model of a llamacpp engine on a thread (engines/llamacpp_load.py), so
    that it overlaps the command's start-up; make_engine's engine takes it. Nothing for others."""
    if engine_name(opts) == "llamacpp":
        from kldtool.engines import defaults, llamacpp_load

        try:
            llamacpp_load.start(opts.model or defaults.default_gguf())
        except EngineError:  # make_engine reports it, after the command's own checks
            pass


def make_engine(opts: EngineOptions, n_ctx: int) -> Engine:
    """Build an engine for windows of ``n_ctx`` tokens (0: as long as the model's context, which
    the engine reads itself); with no model, the built-in default."""
    from kldtool.engines import defaults

    engine = engine_name(opts)
    if opts.contexts is not None and engine != "llamacpp":
        raise UsageError(f"--contexts {opts.contexts}: only for --engine llamacpp (the {engine} engine spreads "
                         f"one batch over its device itself)")
    if opts.server or opts.exchange_dir:
        return _served(opts, n_ctx)
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if opts.vllm and engine != "vllm":
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in opts.vllm)}: only for --engine vllm")
    if engine == "llamacpp":
        from kldtool.engines.llamacpp import LlamaCppEngine

        if opts.dtype not in (None, "gguf"):
            raise UsageError(f"--dtype {opts.dtype}: the llamacpp engine runs the GGUF's own types; drop --dtype")
        if opts.device not in (None, "cpu"):
            raise UsageError(f"--device {opts.device}: this llamacpp engine build runs on the CPU")
        return LlamaCppEngine(opts.model or defaults.default_gguf(), threads=opts.threads,
                              batch_tokens=opts.batch_tokens, contexts=opts.contexts)
    if engine == "python":
        from kldtool.engines.python import PythonEngine

        if opts.model is None:
            raise UsageError("--engine python needs --model package.module:factory")
        if opts.dtype is not None or opts.device not in (None, "cpu"):
            raise UsageError("--dtype/--device: a python engine's factory decides its own")
        return PythonEngine(opts.model, threads=opts.threads, batch_tokens=opts.batch_tokens)
    if engine == "transformers":
        from kldtool.engines.transformers import TransformersEngine

        return TransformersEngine(opts.model or defaults.default_transformers_model(), dtype=opts.dtype or "float32",
                                  device=opts.device or "cpu", threads=opts.threads, batch_tokens=opts.batch_tokens)
    from kldtool.engines.vllm.offline import VllmEngine

    if opts.device not in (None, "cuda", "cpu"):
        raise UsageError(f"--device {opts.device}: vLLM picks its devices itself (see --tensor-parallel-size)")
    return VllmEngine(opts.model or defaults.default_transformers_model(), dtype=opts.dtype,
                      max_model_len=opts.vllm.pop("max_model_len", None) or (n_ctx + 1 if n_ctx else None),
                      windows_per_call=max(4, 65536 // (n_ctx or 2048)),
                      logits_block=opts.vllm.pop("logits_block", None), vllm_args=opts.vllm)


def _served(opts: EngineOptions, n_ctx: int) -> Engine:
    from kldtool.engines.vllm.served import VllmServerEngine

    if not opts.server:
        raise UsageError("--exchange-dir: only with --server URL")
    if opts.engine not in (None, "vllm"):
        raise UsageError(f"--server: a vLLM server; --engine {opts.engine} does not apply")
    server_side = [k for k in opts.vllm if k != "logits_block"]
    if server_side or opts.dtype or opts.device:
        named = [*server_side, *(k for k in ("dtype", "device") if getattr(opts, k))]
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in named)}: the server's own settings "
                         f"(give them to `vllm serve`), not kldtool's with --server")
    return VllmServerEngine(opts.server, tokenizer=opts.model, exchange_dir=opts.exchange_dir, n_ctx=n_ctx,
                            windows_per_call=max(4, 65536 // (n_ctx or 2048)), logits_block=opts.vllm.get("logits_block"))


__all__ = ["Engine", "EngineOptions", "ENGINES", "guess_engine", "make_engine"]
