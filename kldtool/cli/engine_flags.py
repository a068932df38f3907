"""Each engine's own flags in every run command, shown where they apply: a command's ``--help``
lists the flags every engine takes and names each engine's group; ``--engine NAME --help`` (or
``--server URL --help``, ``--endpoint URL --help``, ``-m MODEL --help``) shows that engine's
group too. The groups come from the engines' registry entries (engines/registry.py)."""

from __future__ import annotations

from kldtool.engines import registry
from kldtool.errors import UsageError


def selectors() -> list[str]:
    """The flags that choose an engine of their own (--server, --endpoint): always shown."""
    return [e.selected_by[0] for e in registry.entries() if e.selected_by]


def engine_help() -> str:
    groups = [f"--engine {e.name}" for e in registry.entries() if e.listed and e.takes]
    groups += [f"--{e.selected_by[0]} URL" for e in registry.entries() if e.selected_by and e.takes]
    names = registry.listed()
    return (
        f"{', '.join(names[:-1])} or {names[-1]} (default: from the model path; .gguf -> llamacpp, a helibrunna "
        f"run -> xlstm). An engine's own flags show with {', '.join(groups[:-1])} or {groups[-1]}, then --help."
    )


def show_for(argv: list[str]) -> None:
    """Hide the engine flags that ``argv``'s engine does not take (all of them where it names
    none), so that help lists what applies. Only ``--help`` reads it: a run refuses a flag of
    another engine in one line (registry.refuse_others) whatever is shown."""
    shown = _chosen_takes(argv)
    always = set(selectors())
    for name, (_, option) in registry.all_flags().items():
        option.hidden = name not in always and name not in shown


def _chosen_takes(argv: list[str]) -> set[str]:
    given = {"engine": _value(argv, "--engine"), "gguf_file": _value(argv, "--gguf-file")}
    model = _value(argv, "-m", "--model")
    for e in registry.entries():
        for f in e.selected_by:
            flag = "--" + f.replace("_", "-")
            given[f] = flag in argv or _value(argv, flag) is not None or None
    if model is None and not any(v for k, v in given.items() if k != "gguf_file"):
        return set()
    try:
        e = registry.entry_for(given, model)
    except (UsageError, OSError):  # an unknown engine or clashing flags: the run says which, in one line
        return set()
    return set(e.takes) | set(e.selected_by)


def _value(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1 :]
    return None
