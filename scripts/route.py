"""The route a base file takes through kldtool, traced as the program runs (``sys.setprofile``).

    python scripts/route.py BASE_FILE MODEL [more compare flags]

runs ``kldtool compare`` on BASE_FILE's first two windows in this process and prints its route:
the modules it stops in, their floors, the climbs, how often the busiest module is entered, and
the upcalls.

A value is *carried* when it is the base file's name, or came back from a kldtool call that was
handed a carried value (the reader, a feed of its rows, a window list, the rows of a frame, a
batch's records), or is an element of such a returned list or tuple (the rows of one frame, one
window's records: without this the trace lost the rows where a feed hands them over as a list,
and never reached the reducers). A *stop* is the first call of a kldtool function that receives
a carried value; the route is the modules of those stops in the order they happen, a module's
consecutive stops counted once. A *climb* is a move in that sequence from a module to one on a
higher floor, where a module's floor is one above the highest kldtool module it imports (a
module importing none of them is floor 1): a run's orchestrator calling its helpers in turn
climbs each time it calls the next. An *upcall* is a stop whose nearest kldtool caller on its
thread's stack sits on a lower floor: a callback, a base class calling its subclass, a schedule
calling the engine it was handed.
"""

from __future__ import annotations

import ast
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kldtool"
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def floors() -> dict[str, int]:
    """Each kldtool module's floor, from the imports its source names (any nesting level)."""
    imports: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        imports[name] = set()
        for f in found:
            if f.startswith("kldtool"):
                imports[name].add(f)
    known = set(imports)
    deps = {m: {d for d in ds if d in known and d != m and not m.startswith(d + ".")} for m, ds in imports.items()}
    level: dict[str, int] = {}

    def floor_of(m: str, seen=()) -> int:
        if m not in level:
            below = [floor_of(d, seen + (m,)) for d in deps[m] if d not in seen]
            level[m] = 1 + max(below, default=0)
        return level[m]

    for m in deps:
        floor_of(m)
    return level


@dataclass
class Route:
    stops: list[tuple[str, str]] = field(default_factory=list)  # (module, first function)
    callers: list[str | None] = field(default_factory=list)  # each stop's nearest kldtool caller module

    def modules(self) -> list[str]:
        out: list[str] = []
        for m, _ in self.stops:
            if not out or out[-1] != m:
                out.append(m)
        return out

    def climbs(self, floor: dict[str, int]) -> int:
        ms = self.modules()
        return sum(floor[b] > floor[a] for a, b in zip(ms, ms[1:]))

    def upcalls(self, floor: dict[str, int]) -> list[tuple[str, str, str]]:
        """The stops called from a module on a lower floor: (caller, callee, function)."""
        return [
            (c, m, fn)
            for (m, fn), c in zip(self.stops, self.callers)
            if c is not None and c != m and floor[m] > floor[c]
        ]

    def most_visits(self) -> int:
        ms = self.modules()
        return max(ms.count(m) for m in ms)

    def table(self, floor: dict[str, int]) -> str:
        lines, prev, runs = [], None, []
        for m, f in self.stops:
            if not runs or runs[-1][0] != m:
                runs.append((m, f))
        for i, (m, fn) in enumerate(runs, 1):
            mark = "UP" if prev is not None and floor[m] > floor[prev] else "  "
            lines.append(f"{i:3d}. floor {floor[m]:2d} {mark} {m:36s} {fn}")
            prev = m
        return "\n".join(lines)


class Tracer:
    """Follows the base file's name, and every value carried from it, through kldtool's calls."""

    def __init__(self, path: str):
        self.path = path  # the base file's name, as the command was given it
        self.carried: dict[int, object] = {}  # id -> object, kept alive so ids stay unique
        self.route = Route()
        self.seen_code: set = set()
        self.open_frames: set = set()
        self.lock = threading.Lock()

    def carry(self, obj) -> None:
        if not isinstance(obj, _SCALARS):
            self.carried[id(obj)] = obj
            if isinstance(obj, (list, tuple)):  # a call's results, one per window or frame
                for v in obj[:64]:
                    if not isinstance(v, _SCALARS):
                        self.carried[id(v)] = v

    def _holds(self, value, depth: int = 0) -> bool:
        if id(value) in self.carried or (isinstance(value, str) and value == self.path):
            return True
        if depth or isinstance(value, _SCALARS):
            return False
        if isinstance(value, (list, tuple)):
            return any(self._holds(v, 1) for v in value[:8])
        attrs = getattr(value, "__dict__", None)
        return isinstance(attrs, dict) and any(self._holds(v, 1) for v in list(attrs.values())[:32])

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(str(PACKAGE)):
            return
        with self.lock:
            if event == "call":
                args = [frame.f_locals.get(n) for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
                if not any(self._holds(a) for a in args):
                    return
                self.open_frames.add(id(frame))
                if code not in self.seen_code:
                    self.seen_code.add(code)
                    self.route.stops.append((module_name(Path(code.co_filename)), code.co_qualname))
                    self.route.callers.append(_caller_module(frame))
            elif event == "return" and id(frame) in self.open_frames:
                self.carry(arg)
                owner = frame.f_locals.get("self")
                if owner is not None and self._holds(owner):
                    self.carry(owner)
                if frame.f_code.co_flags & 0x20 == 0:  # a generator's frame returns at each yield
                    self.open_frames.discard(id(frame))

    def __enter__(self):
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def _caller_module(frame) -> str | None:
    """The module of the nearest kldtool frame below ``frame`` on its thread's stack."""
    f = frame.f_back
    while f is not None:
        if f.f_code.co_filename.startswith(str(PACKAGE)):
            return module_name(Path(f.f_code.co_filename))
        f = f.f_back
    return None


def main(argv: list[str]) -> None:
    from kldtool.cli import app

    base, model, *more = argv
    with Tracer(base) as tracer:
        app(["compare", "--kl-divergence-base", base, "-m", model, "--chunks", "2", *more], standalone_mode=False)
    floor = floors()
    print(tracer.route.table(floor))
    up = tracer.route.upcalls(floor)
    for caller, callee, fn in up:
        print(f"upcall: {caller} (floor {floor[caller]}) -> {callee}.{fn} (floor {floor[callee]})")
    print(
        f"stops {len(tracer.route.modules())}, climbs {tracer.route.climbs(floor)}, "
        f"most visits to one module {tracer.route.most_visits()}, upcalls {len(up)}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
