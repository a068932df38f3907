"""Engines by name. Each engine's package says what it is in one ``EngineEntry`` (its
``__init__.py``'s ``ENTRIES``): its class, its options, how a model path is recognised as its,
what it can do, and for a served engine how it is chosen (``Server``); this module lists the
packages (``PACKAGES``, one line per engine package) and generates from their entries what the
CLI shows and refuses: ``--engine``'s choices and help, each engine's flag group, and the
one-line error for a flag given to an engine that does not take it. Nothing here imports an
engine's code: a class is imported only when its engine is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from kldtool.errors import UsageError

PACKAGES = ("transformers", "llamacpp", "vllm", "python", "xlstm", "endpoint")


@dataclass(kw_only=True, frozen=True)
class Server:
    """How an engine whose model runs on a server is chosen and what it leaves to that server:
    it is chosen by its own flags (--server, --endpoint), not by --engine, and -m names only
    the tokenizer."""

    flags: tuple[str, ...]  # the flags that choose it, the first of them taking the URL
    with_engine: tuple[str, ...] = ()  # --engine values those flags allow beside them
    settings: tuple[str, ...] = ()  # flags it refuses as the server's own settings
    settings_of: tuple[str, ...] = ()  # engines whose flags are the server's settings too (but its own)
    note: str = ""  # how that refusal ends
    reads_base_there: bool = False  # the server's workers read the base file (and its head) themselves


@dataclass(kw_only=True, frozen=True)
class EngineEntry:
    """An engine: its class, its options class (whose ``FLAGS`` are its flag group, and whose
    optional ``ALSO_TAKES``, ``REFUSAL_NOTES`` and ``PRELOAD`` say which flags of other groups
    it takes, why other engines refuse one of its own, and which module loads its model on a
    thread), what it can do, how a model is recognised as its, and, for a served engine, how it
    is chosen."""

    name: str
    engine: str  # "module:Class"
    options: str | None = None  # "module:Class" of its options
    can: frozenset[str] = frozenset()  # contract.py's capabilities
    recognizes: Callable[[str | None, str | None], bool] | None = None  # (model, gguf_file) -> its
    default: bool = False  # the engine of a model no other entry recognises
    server: Server | None = None  # its model runs on a server (not a value of --engine)
    weights: bool = True  # -m names weights (a path or hub id to resolve), not code
    text_format: str | None = None  # how its models read a text corpus file (None: as text)

    def load(self):
        return _load(self.engine)

    def options_class(self):
        return _load(self.options) if self.options is not None else None

    def _of_options(self, name: str, default):
        return getattr(self.options_class(), name, default)

    @property
    def listed(self) -> bool:
        """A value of --engine (a served engine is chosen by its flags instead)."""
        return self.server is None

    @property
    def selected_by(self) -> tuple[str, ...]:
        return self.server.flags if self.server else ()

    @property
    def preload(self) -> str | None:
        """A module with start(path, flags) and drop(): the model loaded early on a thread."""
        return self._of_options("PRELOAD", None)

    @property
    def refusal_notes(self) -> tuple[tuple[str, str], ...]:
        """(flag, why only its owners take it), as a refusal names them."""
        return self._of_options("REFUSAL_NOTES", ())

    @property
    def takes(self) -> tuple[str, ...]:
        """The engine-specific flags it takes: its own group's (but those that select it) and
        those of other groups its options name (``ALSO_TAKES``)."""
        return (*(f for f in flag_group(self) if f not in self.selected_by), *self._of_options("ALSO_TAKES", ()))


def _load(target: str):
    """The object a ``"module:name"`` target names (its module imported on first use)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def start_preload(e: EngineEntry, path: str | None, flags: dict) -> None:
    preload = e.preload
    if preload is not None:
        importlib.import_module(preload).start(path, flags)


def drop_preloads() -> None:
    """Drop every model loaded early that no engine took (only where one was started)."""
    import sys

    for e in entries():
        preload = e.preload
        loading = sys.modules.get(preload) if preload else None
        if loading is not None:
            loading.drop()


def entries() -> tuple[EngineEntry, ...]:
    out = []
    for package in PACKAGES:
        out += importlib.import_module(f"kldtool.engines.{package}").ENTRIES
    return tuple(out)


def entry(name: str) -> EngineEntry:
    for e in entries():
        if e.name == name:
            return e
    raise UsageError(f"--engine {name!r}: expected one of {', '.join(listed())}")


def has(engine, capability: str) -> bool:
    """Whether ``engine`` can do ``capability``: its entry's word (make_engine copies it into the
    engine's Facts; an engine a test or a benchmark builds directly is looked up by its name)."""
    can = engine.facts.can or next((e.can for e in entries() if e.name == engine.facts.name), frozenset())
    return capability in can


def listed() -> list[str]:
    return [e.name for e in entries() if e.listed]


def with_capability(can: str) -> list[str]:
    return [e.name for e in entries() if can in e.can]


def bounded_engines() -> list[str]:
    """The engines whose KLD is a lower bound (they see the compared model's top K only): what
    provenance/manifest.check_manifests keeps apart from full values."""
    from kldtool.engines.contract import BOUNDED

    return with_capability(BOUNDED)


def named_with(can: str) -> str:
    """The --engine values with capability ``can``, as a sentence names them ("a, b and c")."""
    names = [n for n in with_capability(can) if n in listed()]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def recognise(model: str | None, gguf_file: str | None = None) -> str:
    """The engine a model path (or none: the built-in default) suggests."""
    found = [e for e in entries() if e.recognizes is not None and not e.default and e.recognizes(model, gguf_file)]
    fallback = [e for e in entries() if e.default]
    return (found or fallback)[0].name


def all_flags() -> dict:
    """Every engine-specific flag, in the order the entries' groups define them: name ->
    (type, typer option)."""
    out: dict = {}
    for e in entries():
        for name, flag in flag_group(e).items():
            out.setdefault(name, flag)
    return out


def flag_group(e: EngineEntry) -> dict:
    """The flags ``e``'s package defines: name -> (type, typer option)."""
    cls = e.options_class()
    return dict(getattr(cls, "FLAGS", {})) if cls is not None else {}


def owners(flag: str) -> list[EngineEntry]:
    """The entries that take ``flag``, the one whose group defines it first."""
    taking = [e for e in entries() if flag in e.takes]
    return sorted(taking, key=lambda e: flag not in flag_group(e))


def entry_for(flags: dict, model: str | None) -> EngineEntry:
    """The entry the command's ``flags`` choose: one whose selecting flag is set (--server,
    --endpoint), else the named engine (``flags["engine"]``), else the one the model path (and
    ``flags["gguf_file"]``) suggests."""
    engine = flags.get("engine")
    by_flag = [e for e in entries() if any(flags.get(f) for f in e.selected_by)]
    if by_flag:
        e = by_flag[0]
        others = [f for o in entries() if o is not e for f in o.selected_by if flags.get(f)]
        if others or (engine is not None and engine not in e.server.with_engine):
            conflicting = ", ".join(_flag(f) for o in entries() if o is not e for f in o.selected_by)
            if not e.server.with_engine:
                raise UsageError(f"{_flag(e.selected_by[0])}: a server of its own; not with {conflicting} or --engine")
            raise UsageError(f"{_flag(e.selected_by[0])}: a vLLM server; --engine {engine} does not apply")
        return e
    return entry(engine or recognise(model, flags.get("gguf_file")))


def refuse_others(e: EngineEntry, flags: dict) -> None:
    """A one-line error for the first kind of engine-specific flag ``flags`` (name -> value,
    unset ones None or False) that ``e`` does not take."""
    server = [f for f in server_settings(e) if _set(flags.get(f))]
    if server:
        raise UsageError(f"{', '.join(_flag(f) for f in server)}: the server's own settings{e.server.note}")
    f = next((f for f in all_flags() if _set(flags.get(f)) and f not in e.takes and f not in e.selected_by), None)
    if f is not None:
        also = owners(f) or [o for o in entries() if f in o.selected_by]
        why = next((w for o in also for k, w in o.refusal_notes if k == f), "")
        raise UsageError(f"{_flag(f, flags[f])}: only {_where(also)}{why.format(engine=e.name)}")


def server_settings(e: EngineEntry) -> list[str]:
    """The flags ``e`` refuses as settings of the server it talks to."""
    if e.server is None:
        return []
    own = e.server.settings
    of = [f for name in e.server.settings_of for f in entry(name).takes if f not in e.takes]
    return [*own, *(f for f in of if f not in own)]


def _where(owning: list[EngineEntry]) -> str:
    named = [o.name for o in owning if o.listed]
    selectors = [f"{_flag(o.selected_by[0])} URL" for o in owning if o.selected_by and not o.listed]
    where = [f"for --engine {' or '.join(named)}"] if named else []
    return " or ".join(where + ([f"with {' or '.join(selectors)}"] if selectors else []))


def _set(value) -> bool:
    return value is not None and value is not False and value != [] and value != ()


def _flag(name: str, value=None) -> str:
    flag = "--" + name.replace("_", "-")
    return f"{flag} {value}" if isinstance(value, (int, float, str)) and not isinstance(value, bool) else flag
