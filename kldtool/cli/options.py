"""Flags that several commands share (their groups in flag_groups.py): each group is added to a
command by ``@flags(name=GROUP)`` and reaches it as one namespace, which the builders here turn
into an engine, a protocol, a corpus or a bootstrap with the same checks for every command."""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

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
    from kldtool.engines import start_loading as start

    start(vars(opts), model)


def engine_options(opts: SimpleNamespace, model: str | None):
    """The engine options a command's ENGINE flags describe, checked (nothing is opened)."""
    from kldtool.engines import options_from_flags

    if opts.threads is not None and opts.threads < 1:
        raise UsageError(f"--threads {opts.threads}: must be at least 1")
    if getattr(opts, "batch", 1) < 1:  # a command without -b (generate) runs no batches
        raise UsageError(f"--batch-size {opts.batch}: must be at least 1")
    return options_from_flags(vars(opts), model)


def open_engine(opts: SimpleNamespace, model: str | None, n_ctx: int, sampling: bool = False, top_logprobs=None):
    """The engine a command's ENGINE flags describe, for windows of ``n_ctx`` tokens; with
    ``sampling``, for ``generate`` (a server's sampled answers with ``top_logprobs`` each)."""
    from dataclasses import replace

    from kldtool.engines import make_engine
    from kldtool.runtime.memory import note_long_window

    built = engine_options(opts, model)
    if sampling and built.engine == "endpoint":
        built = replace(built, specific=replace(built.specific, sampling=True, top_k=top_logprobs))
    elif top_logprobs is not None:
        raise UsageError("--top-logprobs: only with --endpoint (a server's log-probs of what it sampled)")
    engine = make_engine(built, n_ctx)
    note_long_window(n_ctx)
    return engine


def protocol_of(opts: SimpleNamespace, corpus: SimpleNamespace):
    """The protocol the SCORING flags name; unnamed, llama.cpp's chunks, or for a corpus of
    ``kldtool generate`` its samples as documents."""
    from kldtool.text.generated import is_generated
    from kldtool.text.protocols import HALF_SCORED_CHUNKS, Protocol

    name = opts.protocol
    if name is None:
        own = corpus.file is not None and corpus.corpus_format in ("auto", "generated") and is_generated(corpus.file)
        name = "documents" if own else HALF_SCORED_CHUNKS
    return Protocol.from_flags(name, opts.ctx_size, opts.stride, opts.lengths, opts.prefix_token, opts.full_length_only)


def longest(spec, corpus=None) -> int:
    """The window length engines are built for before the corpus is tokenized (vLLM's
    max_model_len is this + 1); 0 lets the engine take the model's context (rolling's default
    window). Whole documents of ids (a generated corpus) are as long as the longest: a guess of
    8192 would ask an 8,192-token model for 8,193."""
    fixed = max(spec.n_ctx, max(spec.lengths, default=0))
    if fixed or spec.name == "rolling":
        return fixed
    known = corpus.longest_document() if corpus is not None else None
    return known or 8192


def corpus_of(opts: SimpleNamespace, engine: str | None = None, model: str | None = None):
    """The corpus the CORPUS flags name; a text file is read as the engine's models read one (a
    helibrunna run's: whitespace tokens, a document per line, with line numbers in errors),
    unless --corpus-format says otherwise."""
    from kldtool.engines import registry
    from kldtool.text.corpus import guess_format, open_corpus

    fmt = opts.corpus_format
    if fmt == "auto" and opts.file is not None and guess_format(str(opts.file)) == "text":
        name = engine or registry.recognise(model)
        if name in registry.listed():  # an unknown --engine is refused once the engine is built
            fmt = registry.entry(name).text_format or fmt
    return open_corpus(opts.file, fmt, opts.text_field, opts.score)


def bootstrap_of(opts: SimpleNamespace):
    from kldtool.stats.bootstrap import Bootstrap

    if opts.resamples < 0:
        raise UsageError(f"--bootstrap {opts.resamples}: must be 0 (none) or more")
    return Bootstrap(opts.resamples, opts.seed)
