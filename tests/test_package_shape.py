"""The package's layering, read from its source: no import cycle (imports inside functions
count: they are cycles deferred, not avoided), the codec beneath the reducer, results beside
the run layer rather than under it, and CLI modules small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "kldtool"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """kldtool modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            for a in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "kldtool.codec.rows" in graph["kldtool.reduce.rowmath"]
    assert "kldtool.reduce.numba_cpu" in graph["kldtool.reduce"]  # an import inside a function
    assert "kldtool.cli.runs" in graph["kldtool.cli"]


def test_no_import_cycle():
    graph = _graph()
    cycles = sorted(m for m in graph if m in _reachable(graph, m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_layers():
    graph = _graph()
    for mod in graph:
        if mod.startswith("kldtool.codec"):
            assert not any(m.startswith("kldtool.reduce") for m in _reachable(graph, mod)), mod
        if mod.startswith("kldtool.report"):
            assert not any(m.startswith("kldtool.pipeline") for m in _reachable(graph, mod)), mod


def test_cli_modules_stay_small():
    for path in (PKG / "cli").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 250, path.name
