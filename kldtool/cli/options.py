"""Flags that several commands share (their groups in flag_groups.py): each group is added to a
command by ``@flags(name=GROUP)`` and reaches it as one namespace, which the builders here turn
into an engine, a protocol, a corpus or a bootstrap with the same checks for every command."""

from __future__ import annotations

import sys

import functools
import json
import inspect
from types import SimpleNamespace


from kldtool.cli.flag_groups import VLLM_KEYS
from kldtool.errors import UsageError


def flags(**groups: dict):
    """Add each group's options to the decorated command, which receives a group's values as
    one namespace in its parameter of the group's name (typer reads the rewritten signature)."""

    def decorate(func):
        sig = inspect.signature(func, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name not in groups]
        for group in groups.values():
            params += [
                inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=tp)
                for n, (tp, opt) in group.items()
            ]

        @functools.wraps(func)
        def command(**kwargs):
            for name, group in groups.items():
                kwargs[name] = SimpleNamespace(**{n: kwargs.pop(n) for n in group})
            return func(**kwargs)

        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def start_loading(opts: SimpleNamespace, model: str | None) -> None:
    """Begin loading the model open_engine will build its engine for, where that can run beside
    the command's own start-up (a GGUF: engines/llamacpp/load.py); call it first thing."""
    from kldtool.engines import EngineOptions, start_loading as start

    start(
        EngineOptions(
            opts.engine,
            model,
            server=opts.server,
            exchange_dir=opts.exchange_dir,
            endpoint=opts.endpoint,
            revision=opts.revision,
            gguf_file=opts.gguf_file,
        )
    )


def open_engine(opts: SimpleNamespace, model: str | None, n_ctx: int):
    """The engine a command's ENGINE flags describe, for windows of ``n_ctx`` tokens."""
    from kldtool.engines import EngineOptions, make_engine
    from kldtool.runtime.memory import for_window

    if opts.threads is not None and opts.threads < 1:
        raise UsageError(f"--threads {opts.threads}: must be at least 1")
    if opts.batch < 1:
        raise UsageError(f"--batch-size {opts.batch}: must be at least 1")
    if opts.contexts is not None and opts.contexts < 1:
        raise UsageError(f"--contexts {opts.contexts}: must be at least 1")
    # Only flags the user set reach vLLM (and are refused by the other engines); an unset switch is False.
    vllm = {k: v for k in VLLM_KEYS if (v := getattr(opts, k)) is not None and v is not False}
    vllm.update(parse_vllm_args(opts.vllm_arg or []))
    engine = make_engine(
        EngineOptions(
            opts.engine,
            model,
            opts.dtype,
            opts.device,
            opts.threads,
            opts.batch,
            vllm,
            opts.server,
            opts.exchange_dir,
            opts.contexts,
            opts.revision,
            opts.gguf_file,
            opts.flash_attn,
            endpoint=opts.endpoint,
            endpoint_model=opts.endpoint_model,
            endpoint_api=opts.endpoint_api,
            top_k=opts.top_k,
            concurrency=opts.concurrency,
        ),
        n_ctx,
    )
    if for_window(n_ctx):  # once the engine is made: a refused flag is the only line printed
        print(
            f"note: windows of {n_ctx} tokens: freed buffers go back to the system (KLDTOOL_MALLOC=mmap)",
            file=sys.stderr,
        )
    return engine


def protocol_of(opts: SimpleNamespace):
    from kldtool.text.protocols import Protocol

    return Protocol.from_flags(
        opts.protocol, opts.ctx_size, opts.stride, opts.lengths, opts.prefix_token, opts.full_length_only
    )


def longest(spec) -> int:
    """The window length engines are built for before the corpus is read (vLLM's max_model_len);
    0 lets the engine take the model's context (rolling's default window)."""
    return max(spec.n_ctx, max(spec.lengths, default=0)) or (0 if spec.name == "rolling" else 8192)


def corpus_of(opts: SimpleNamespace, engine: str | None = None, model: str | None = None):
    """The corpus the CORPUS flags name; for a helibrunna run's model a text file is read as
    whitespace tokens, a document per line (its tokenizer's own reading, with line numbers in
    errors), unless --corpus-format says otherwise."""
    from kldtool.text.corpus import guess_format, open_corpus

    fmt = opts.corpus_format
    if fmt == "auto" and opts.file is not None and guess_format(str(opts.file)) == "text":
        from kldtool.engines.xlstm import helibrunna

        if engine == "xlstm" or (engine is None and model is not None and helibrunna.looks_like(model)):
            fmt = "tokens"
    return open_corpus(opts.file, fmt, opts.text_field)


def bootstrap_of(opts: SimpleNamespace):
    from kldtool.stats.bootstrap import Bootstrap

    if opts.resamples < 0:
        raise UsageError(f"--bootstrap {opts.resamples}: must be 0 (none) or more")
    return Bootstrap(opts.resamples, opts.seed)


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
