"""What both base-file writers share: the locked partial file, its journal, and resuming.

``create_writer`` opens one and starts it; with ``resume`` the caller instead does
``records = w.recover(settings); w.keep(records[:k], settings)``. Then, for each remaining
chunk, ``write_rows(block)`` as its rows come (any block sizes, in order) and ``end_chunk(nll)``,
or ``write_chunk(rows, nll)`` for both at once; ``finish(metadata)`` renames the file into place;
``abort(keep)`` stops, keeping the partial for a later resume or removing it.
"""

from __future__ import annotations

import numpy as np

from kldtool.errors import UsageError
from kldtool.logitsfile.header import BaseHeader
from kldtool.logitsfile.partial import Journal, PartialFile


class ResumableWriter:
    format_name = "?"

    def __init__(self, path, header: BaseHeader, tokens: np.ndarray, metadata: dict | None = None):
        self.header = header
        self.metadata = dict(metadata or {})
        self.preamble = self._preamble(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
        self.out = PartialFile(path)
        self.journal = Journal(self.out.journal_path, [header.rows_of(i) for i in range(header.n_chunk)])
        self.n_written = 0
        self._rows_in_chunk = 0
        self._ends: list[int] = []
        self.found_stale = self.out.size() > 0

    # -- format-specific parts -------------------------------------------------------------
    def _preamble(self, token_bytes: bytes) -> bytes:
        raise NotImplementedError

    def _chunk_ends(self, start: int, size: int) -> list[int]:
        """File offsets where each complete chunk of an interrupted file ends."""
        raise NotImplementedError

    def _append_rows(self, rows: np.ndarray) -> None:
        """Rows of the current chunk, in order; a long chunk comes in several calls."""
        raise NotImplementedError

    def _chunk_done(self) -> None:
        pass

    def _finish(self) -> None:
        pass

    def _kept(self, ends: list[int]) -> None:
        pass

    # -- the shared protocol ---------------------------------------------------------------
    def start(self, settings: dict | None = None) -> None:
        self.out.keep(0)
        self.out.write(self.preamble)
        if settings is not None:
            self.journal.start(settings)
        else:
            self.journal.path.unlink(missing_ok=True)

    def recover(self, settings: dict) -> list[np.ndarray]:
        """The NLL of each chunk an interrupted run finished, after checking it ran with the
        same settings. Empty when there is nothing to continue (then :meth:`start` was done)."""
        size = self.out.size()
        stored, records = self.journal.load()
        if size == 0 or stored is None:
            self.start(settings)
            return []
        where = self.out.tmp_path
        if stored != settings:
            diff = ", ".join(
                f"{k}: {stored.get(k)!r} then, {settings.get(k)!r} now"
                for k in sorted(set(stored) | set(settings))
                if stored.get(k) != settings.get(k)
            )
            raise UsageError(
                f"cannot resume {where}: it was written with other settings ({diff}); "
                f"run without --resume to start over"
            )
        if self.out.read(0, len(self.preamble)) != self.preamble:
            raise UsageError(f"cannot resume {where}: its header or tokens differ from this run's")
        self._ends = self._chunk_ends(len(self.preamble), size)
        return records[: len(self._ends)]

    def keep(self, records: list[np.ndarray], settings: dict) -> None:
        """Continue after the first ``len(records)`` recovered chunks."""
        k = len(records)
        self.out.keep(self._ends[k - 1] if k else len(self.preamble))
        self.journal.keep(settings, records)
        self.n_written = k
        self._kept(self._ends[:k])

    def stored_width(self) -> int:
        """Values per stored row: a row's uint16 slots (or a hidden state's dimensions)."""
        return self.header.row_width

    def write_rows(self, rows: np.ndarray) -> None:
        h = self.header
        room = h.rows_of(self.n_written) - self._rows_in_chunk if self.n_written < h.n_chunk else 0
        if rows.ndim != 2 or rows.shape[1] != self.stored_width() or not 0 < len(rows) <= room:
            raise ValueError(
                f"rows of shape {rows.shape} for chunk {self.n_written}, which has room for "
                f"{room} rows of {self.stored_width()}"
            )
        self._append_rows(rows)
        self._rows_in_chunk += len(rows)

    def end_chunk(self, nll: np.ndarray | None = None) -> None:
        want = self.header.rows_of(self.n_written)
        if self._rows_in_chunk != want:
            raise ValueError(f"chunk {self.n_written} ended after {self._rows_in_chunk} of its {want} rows")
        self._chunk_done()
        self._rows_in_chunk = 0
        self.n_written += 1
        if nll is not None:
            self.journal.append(nll)

    def write_chunk(self, rows: np.ndarray, nll: np.ndarray | None = None) -> None:
        self.write_rows(rows)
        self.end_chunk(nll)

    def finish(self, metadata: dict | None = None) -> None:
        self.metadata.update(metadata or {})
        if self.n_written != self.header.n_chunk:
            self.abort()
            raise ValueError(f"wrote {self.n_written} of {self.header.n_chunk} chunks")
        self._finish()
        self.journal.close()
        self.out.commit()

    def abort(self, keep: bool = False) -> None:
        self.journal.close()
        self.out.abort(keep)
