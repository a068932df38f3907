"""Small pieces both phases share: output sinks, batching of windows, run metadata."""

from __future__ import annotations

import datetime
import json
import platform
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kldtool import __version__
from kldtool.logitsfile.atomic import AtomicFile


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


def write_text(path: str, text: str) -> None:
    f = AtomicFile(path)
    f.write(text.encode("utf-8"))
    f.commit()


def read_json(path: str, where: str) -> object:
    """A JSON file's content; a one-line UsageError naming ``where`` when it cannot be."""
    from kldtool.errors import UsageError

    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise UsageError(f"{where}: not JSON ({e})") from None


def write_json(path: str, payload: dict) -> None:
    write_text(path, json.dumps(payload, indent=2, sort_keys=False, allow_nan=True) + "\n")
