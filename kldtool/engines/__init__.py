"""Engines: the contract every engine keeps (contract.py), the registry of their entries
(registry.py), and building the one a command's flags choose. The package stays light: an
engine's class is imported only when it is built (start_loading runs before numpy is)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from kldtool.engines import registry
from kldtool.errors import EngineError, UsageError
from kldtool.provenance import model_ref


@dataclass(kw_only=True, frozen=True)
class EngineOptions:
    """What every engine is built from; ``specific`` is the chosen engine's own options (its package's
    options.py), None for its defaults."""

    engine: str | None = None  # an entry's name (None: the one the model path suggests)
    model: str | None = None
    dtype: str | None = None
    device: str | None = None
    threads: int | None = None
    batch_tokens: int = 2048
    revision: str | None = None  # a hub id's branch, tag or commit
    gguf_file: str | None = None  # a GGUF inside the hub repository -m names
    specific: object = None


def options_from_flags(flags: dict, model: str | None) -> EngineOptions:
    """The options a command's engine flags (name -> value, every group's) describe: the
    chosen engine's own flags checked by its options class, another engine's refused."""
    e = registry.entry_for(flags, model)
    registry.refuse_others(e, flags)
    cls = e.options_class()
    return EngineOptions(
        engine=e.name,
        model=model,
        dtype=flags.get("dtype"),
        device=flags.get("device"),
        threads=flags.get("threads"),
        batch_tokens=flags.get("batch", 2048),
        revision=flags.get("revision"),
        gguf_file=flags.get("gguf_file"),
        specific=cls.from_flags({k: flags.get(k) for k in (*e.selected_by, *e.takes)}) if cls is not None else None,
    )


def start_loading(flags: dict, model: str | None) -> None:
    """Begin loading the model of an engine that can load it on a thread (llama.cpp's GGUF:
    engines/llamacpp/load.py), so that it overlaps the command's start-up; make_engine's
    engine takes it. Nothing for others, nor where the flags are wrong (make_engine says so)."""
    try:
        e = registry.entry_for(flags, model)
        if e.preload is None:  # only an engine that loads its model on a thread
            return
        ref = _model_ref(model, flags.get("revision"), flags.get("gguf_file"))
        registry.start_preload(e, ref.path if ref else None, flags)  # None: the engine's built-in model
    except (EngineError, UsageError):
        pass


def _model_ref(model: str | None, revision: str | None, gguf_file: str | None) -> model_ref.ModelRef | None:
    """Where the model named is on this machine (a hub id resolved); None: the default."""
    if model is None:
        if revision or gguf_file:
            raise UsageError(f"--{'revision' if revision else 'gguf-file'}: only with -m naming a hub id")
        return None
    return model_ref.resolve(model, revision, gguf_file)


def make_engine(opts: EngineOptions, n_ctx: int):
    """Build an engine for windows of ``n_ctx`` tokens (0: as long as the model's context, which
    the engine reads itself); with no model, the built-in default."""
    e = registry.entry(opts.engine or registry.recognise(opts.model, opts.gguf_file))
    engine, source = _built(e, opts, n_ctx)
    engine.facts = replace(engine.facts, can=e.can, source=source)  # what it can do is its entry's word
    return engine


def _built(e: registry.EngineEntry, opts: EngineOptions, n_ctx: int):
    """The engine and where its model came from (None: code, a server's own model, or unknown)."""
    cls = e.load()
    if not e.weights:  # -m names code (a factory), not weights to find
        return cls.from_options(opts, n_ctx), None
    ref = _model_ref(opts.model, opts.revision, opts.gguf_file)
    engine = cls.from_options(replace(opts, model=ref.path if ref else None), n_ctx)
    if e.server:  # -m names only the tokenizer; the server's model is its own
        return engine, None
    if ref is None:  # the built-in default: recorded by the path the engine chose
        default = engine.facts.model
        ref = model_ref.ModelRef(given=default, path=default) if default and os.path.exists(default) else None
    return engine, ref.record() if ref else None


__all__ = ["EngineOptions", "make_engine", "options_from_flags", "start_loading"]
