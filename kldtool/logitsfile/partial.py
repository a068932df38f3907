"""A base file while it is being written.

It lives under a fixed hidden name beside the target (``.NAME.partial``), locked by the
process writing it, and is renamed to NAME only when complete, so nothing at NAME ever looks
finished before it is. After a crash or Ctrl-C it stays behind for ``--resume``.

Beside it, a journal (``.NAME.partial.journal``) holds the run's settings as one JSON line,
then each finished chunk's float32 target NLL: the stored rows are rounded, so they cannot
give back the exact NLL the perplexity line is computed from.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import numpy as np

from kldtool.errors import OutputError
from kldtool.logitsfile.atomic import output_target, partial_path


class PartialFile:
    def __init__(self, path: str | os.PathLike):
        self.path = output_target(path)
        parent = self.path.parent
        self.tmp_path = partial_path(self.path)
        self.journal_path = parent / f".{self.path.name}.partial.journal"
        try:
            fd = os.open(self.tmp_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OutputError(f"{self.path}: cannot create {self.tmp_path.name} ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise OutputError(f"{self.path}: another kldtool process is writing it ({self.tmp_path})") from None
        self.fh = os.fdopen(fd, "r+b")
        self.done = False

    def size(self) -> int:
        self.fh.flush()
        return os.fstat(self.fh.fileno()).st_size

    def read(self, offset: int, n: int) -> bytes:
        self.fh.flush()
        return os.pread(self.fh.fileno(), n, offset)

    def keep(self, n_bytes: int) -> None:
        """Cut the file to its first ``n_bytes`` and append from there."""
        self.fh.flush()
        self.fh.truncate(n_bytes)
        self.fh.seek(n_bytes)

    def _fail(self, e: OSError, doing: str):
        if e.errno == errno.ENOSPC:
            raise OutputError(
                f"{self.path}: disk full while {doing}; what was written is kept in "
                f"{self.tmp_path} (free space, then run again with --resume)"
            ) from None
        raise OutputError(f"{self.path}: {doing} failed ({e.strerror})") from None

    def write(self, data) -> None:
        try:
            self.fh.write(data)
        except OSError as e:
            self._fail(e, "writing")

    def tell(self) -> int:
        return self.fh.tell()

    def commit(self) -> None:
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            os.replace(self.tmp_path, self.path)
        except OSError as e:
            self._fail(e, "finishing")
        self.journal_path.unlink(missing_ok=True)
        self.done = True
        self.fh.close()

    def abort(self, keep: bool = False) -> None:
        """Stop writing; remove the partial file unless ``keep`` (for ``--resume``)."""
        if self.done:
            return
        self.done = True
        try:
            self.fh.close()
        except OSError:
            pass
        if not keep:
            self.tmp_path.unlink(missing_ok=True)
            self.journal_path.unlink(missing_ok=True)


class Journal:
    """Settings line, then each chunk's float32 NLL record, appended and flushed per chunk."""

    def __init__(self, path: Path, record_lens: list[int]):
        self.path, self.record_lens = path, record_lens
        self.fh = None

    def start(self, settings: dict) -> None:
        self.fh = open(self.path, "wb")
        self.fh.write(json.dumps(settings, sort_keys=True).encode("utf-8") + b"\n")
        self.fh.flush()

    def load(self) -> tuple[dict | None, list[np.ndarray]]:
        """(settings, records) of an earlier run; (None, []) when there is no usable journal."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None, []
        line, sep, rest = data.partition(b"\n")
        try:
            settings = json.loads(line.decode("utf-8")) if sep else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            settings = None
        if not isinstance(settings, dict):
            return None, []
        records, at = [], 0
        for n in self.record_lens:
            if at + 4 * n > len(rest):
                break
            records.append(np.frombuffer(rest, "<f4", n, at).copy())
            at += 4 * n
        return settings, records

    def keep(self, settings: dict, records: list[np.ndarray]) -> None:
        """Rewrite the journal with these records, to append after them."""
        self.start(settings)
        for r in records:
            self.append(r)

    def append(self, nll: np.ndarray) -> None:
        if self.fh is None:
            return
        try:
            self.fh.write(np.ascontiguousarray(nll, "<f4").tobytes())
            self.fh.flush()
        except OSError as e:
            raise OutputError(f"{self.path}: writing failed ({e.strerror})") from None

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
