"""Small pieces both phases share: output sinks, batching of windows, run metadata."""

from __future__ import annotations

import datetime
import platform
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kldtool import __version__


@dataclass
class Sinks:
    """Where text goes: ``out`` for the llama.cpp-layout results (stdout), ``info`` for
    progress and notes (stderr)."""

    out: Callable[[str], None] = field(default=lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    info: Callable[[str], None] = field(default=lambda s: (sys.stderr.write(s + "\n"), sys.stderr.flush()))

    def line(self, s: str = "") -> None:
        self.out(s + "\n")


def groups(windows: list, size: int) -> Iterator[list]:
    """Consecutive windows of one shape, at most ``size`` at a time: what one engine call takes."""
    group: list = []
    for w in windows:
        if group and (len(group) == size or w.shape != group[0].shape):
            yield group
            group = []
        group.append(w)
    if group:
        yield group


def whole_batches(windows: list, size: int, k: int) -> int:
    """The largest batch boundary at or below ``k`` windows: where a resumed run may continue
    and still evaluate the same batches (so it prints the same digits)."""
    done = 0
    for g in groups(windows, size):
        if done + len(g) > k:
            break
        done += len(g)
    return done


def run_metadata(command: str) -> dict:
    return {
        "kldtool_version": __version__,
        "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "host": platform.node(),
    }
