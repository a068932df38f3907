"""Writing kldtool's container (layout in container.py): frames compressed on worker threads and
appended in order, the file resumable after a crash from its last whole chunk, and complete only
once its trailer is written."""

from __future__ import annotations

import json
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

from kldtool.codec import DEFAULT_CLAMP
from kldtool.logitsfile.container import DEFAULT_LEVEL, MAX_FRAME_ROWS, form_for_writing, preamble, trailer
from kldtool.logitsfile.frames import FrameLayout, default_frame_rows
from kldtool.logitsfile.header import CONTAINER, BaseHeader
from kldtool.logitsfile.transforms import MaskedPlanes, Transform
from kldtool.logitsfile.writer_base import ResumableWriter


class ContainerWriter(ResumableWriter):
    """Compresses frames of ``frame_rows`` rows (0: a whole chunk each, the pre-frame layout)
    on worker threads (zstd releases the GIL) and appends them in order. A chunk's rows may
    come in blocks of any size: at most one frame's rows wait for the next block."""

    format_name = CONTAINER

    def __init__(
        self,
        path,
        header: BaseHeader,
        tokens: np.ndarray,
        metadata: dict | None = None,
        level: int = DEFAULT_LEVEL,
        rows: type[Transform] = MaskedPlanes,
        threads: int = 2,
        frame_rows: int | None = None,
    ):
        # Hidden states (metadata "hidden") or rows: top-K records, else ``rows``.
        self.level = level
        self.form = form_for_writing(header, metadata or {}, rows)
        if frame_rows is None:
            frame_rows = default_frame_rows(header.row_width, replayed=self.form.replayed)
        self.frame_rows = frame_rows
        if not 0 <= self.frame_rows <= MAX_FRAME_ROWS:
            raise ValueError(f"{self.frame_rows} rows per frame: expected 0 .. {MAX_FRAME_ROWS}")
        self.layout = FrameLayout([header.rows_of(i) for i in range(header.n_chunk)], self.frame_rows)
        metadata = (metadata or {}) | self.form.metadata()
        if header.clamp != DEFAULT_CLAMP:
            metadata = (metadata or {}) | {"clamp": header.clamp}
        super().__init__(path, header, tokens, metadata)
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads))
        self.pending = []
        self.index: list[tuple[int, int]] = []
        self.waiting: list[np.ndarray] = []  # rows of the current frame so far
        self._frame_ends: list[int] = []
        self.sections: list = []  # stored after the frames at finish (routing/section.py)

    def stored_width(self) -> int:
        return self.form.width

    def set_head(self, head, source: str | None = None) -> None:
        """A hidden-state file's output head (hidden.OutputHead), stored by finish, or with
        ``source`` only named there with its hash (``--head external``)."""
        self.form.head, self.form.head_source = head, source

    def _preamble(self, token_bytes: bytes) -> bytes:
        return preamble(self.header, self.form.code, token_bytes, framed=bool(self.frame_rows))

    def _chunk_ends(self, start: int, size: int) -> list[int]:
        """Walk the frames an interrupted run left; the first cut or damaged one ends the walk.
        A chunk counts once all its frames are there."""
        ends, pos = [], start
        while pos < size and len(ends) < self.layout.n_frames:
            d = zstandard.ZstdDecompressor().decompressobj()
            off = pos
            try:
                while off < size and not d.eof:
                    block = self.out.read(off, min(1 << 22, size - off))
                    d.decompress(block)
                    off += len(block)
            except zstandard.ZstdError:
                break
            if not d.eof:
                break
            pos = off - len(d.unused_data)
            ends.append(pos)
        self._frame_ends = ends
        whole = [c for c in range(self.header.n_chunk) if self.layout.first[c + 1] <= len(ends)]
        return [ends[int(self.layout.first[c + 1]) - 1] for c in whole]

    def _kept(self, ends: list[int]) -> None:
        n = int(self.layout.first[len(ends)])
        frame_ends = self._frame_ends[:n]
        starts = [len(self.preamble)] + frame_ends[:-1]
        self.index = [(a, b - a) for a, b in zip(starts, frame_ends)]

    def _compress(self, rows: np.ndarray) -> bytes:
        cctx = zstandard.ZstdCompressor(level=self.level, write_checksum=True, write_content_size=True)
        return cctx.compress(self.form.frame_bytes(rows))

    def _append_rows(self, rows: np.ndarray) -> None:
        per = self.frame_rows or self.header.rows_of(self.n_written)
        room = self.header.rows_of(self.n_written) - self._rows_in_chunk
        have = sum(len(r) for r in self.waiting)
        while len(rows):
            take = min(per - have, len(rows))
            self.waiting.append(rows[:take])
            have, rows = have + take, rows[take:]
            room -= take
            if have == per or room == 0:
                self._submit()
                have = 0

    def _submit(self) -> None:
        frame = np.concatenate(self.waiting) if len(self.waiting) > 1 else np.array(self.waiting[0])
        self.waiting = []
        if not self.form.replayed:
            frame = frame.astype("<u2", copy=False)
        self.pending.append(self.pool.submit(self._compress, frame))
        while len(self.pending) > 4 or (self.pending and self.pending[0].done()):
            self._drain_one()

    def _drain_one(self) -> None:
        frame = self.pending.pop(0).result()
        self.index.append((self.out.tell(), len(frame)))
        self.out.write(frame)

    def _finish(self) -> None:
        while self.pending:
            self._drain_one()
        self.pool.shutdown()
        for section in self.sections:
            self.metadata[section.name] = section.write(self.out, self.header.n_chunk)
        if self.form.replayed:  # the head the hidden states are replayed through, after the last frame
            self.metadata["head"], section = self.form.head_section(self.out.tell())
            self.out.write(section)
        index = np.array(self.index, dtype="<u8").tobytes()
        meta = json.dumps(self.metadata, sort_keys=True).encode("utf-8")
        index_offset = self.out.tell()
        self.out.write(index + meta)
        self.out.write(trailer(index_offset, len(meta), zlib.crc32(index + meta), self.frame_rows))

    def abort(self, keep: bool = False) -> None:
        # Frames already compressed are written first, so Ctrl-C keeps as much as it can.
        try:
            while keep and self.pending:
                self._drain_one()
        except Exception:
            pass
        for f in self.pending:
            f.cancel()
        self.pool.shutdown(wait=True)
        super().abort(keep)
