"""Write a file under a temporary name and rename it only once it is complete.

A crash, Ctrl-C or full disk therefore never leaves a file at the final path that looks
finished: at worst a ``.NAME.partial-PID`` file remains beside it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from kldtool.errors import OutputError


def output_target(path: str | os.PathLike) -> Path:
    """``path`` as a place a file can be written to, or a one-line OutputError why not."""
    target = Path(path)
    if target.is_dir():
        raise OutputError(f"{target}: is a directory")
    if not target.parent.is_dir():
        raise OutputError(f"{target}: directory {target.parent} does not exist")
    return target


def partial_path(target: Path) -> Path:
    """The stable hidden name a resumable output grows under until it is complete."""
    return target.parent / f".{target.name}.partial"


class AtomicFile:
    def __init__(self, path: str | os.PathLike):
        self.path = output_target(path)
        self.tmp_path = self.path.parent / f".{self.path.name}.partial-{os.getpid()}"
        try:
            self.fh = open(self.tmp_path, "wb")
        except OSError as e:
            raise OutputError(f"{self.path}: cannot create ({e.strerror})") from None
        self.done = False

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as e:
            self.abort()
            if e.errno == errno.ENOSPC:
                raise OutputError(f"{self.path}: disk full while writing (partial output removed)") from None
            raise OutputError(f"{self.path}: write failed ({e.strerror})") from None

    def tell(self) -> int:
        return self.fh.tell()

    def commit(self) -> None:
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.replace(self.tmp_path, self.path)
        except OSError as e:
            self.abort()
            raise OutputError(f"{self.path}: could not finish writing ({e.strerror})") from None
        self.done = True

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.fh.close()
        finally:
            try:
                self.tmp_path.unlink()
            except FileNotFoundError:
                pass
