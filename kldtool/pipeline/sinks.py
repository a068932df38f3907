"""Where a run's text goes: the llama.cpp-layout results to stdout, progress and notes to stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Sinks:
    """Where text goes: ``out`` for the llama.cpp-layout results (stdout), ``info`` for
    progress and notes (stderr)."""

    out: Callable[[str], None] = field(default=lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    info: Callable[[str], None] = field(default=lambda s: (sys.stderr.write(s + "\n"), sys.stderr.flush()))

    def line(self, s: str = "") -> None:
        self.out(s + "\n")
