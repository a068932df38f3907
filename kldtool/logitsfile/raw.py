"""llama.cpp's raw base-file layout, byte-compatible with ``llama-perplexity``.

    "_logits_" | int32 n_ctx | int32 n_vocab | int32 n_chunk | int32 tokens[n_ctx*n_chunk]
    | n_chunk * rows_per_chunk rows of row_width uint16

There is no version, checksum or completion marker, so completeness is judged from the size.

The rows are read through a read-only map of the file: a frame is a view of the page cache,
so the reducer reads the rows where they lie instead of a copy made first (copying a 20-chunk
a copy of every row first would cost CPU time beside the engine's own work).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from kldtool.errors import NotABaseFile, RowLayoutError, TruncatedHeader, TruncatedRows
from kldtool.logitsfile.frames import default_frame_rows
from kldtool.logitsfile.header import RAW_LAYOUT, BaseHeader
from kldtool.logitsfile.reader_base import BaseFileReader, Frame
from kldtool.logitsfile.transforms import PlainRows
from kldtool.logitsfile.writer_base import ResumableWriter
from kldtool.text.protocols import HALF_SCORED_CHUNKS

MAGIC = b"_logits_"
PREAMBLE = 20


class RawReader(BaseFileReader):
    format_name = RAW_LAYOUT

    def _parse(self) -> None:
        head = os.pread(self.fd, PREAMBLE, 0)
        if head[:8] != MAGIC:
            if len(head) < 8 and MAGIC.startswith(head):
                self._fail(f"truncated header: {len(head)} bytes, need {PREAMBLE}", TruncatedHeader)
            self._fail(f"not a base file (bytes 0-7 are {head[:8]!r}, expected {MAGIC!r})", NotABaseFile)
        if len(head) < PREAMBLE:
            self._fail(f"truncated header: {len(head)} bytes, need {PREAMBLE}", TruncatedHeader)
        n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, dtype="<i4", count=3, offset=8))
        self.header = h = BaseHeader(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk)
        if h.problems():
            self._fail(f"invalid header at offset 8: {'; '.join(h.problems())}", NotABaseFile)
        self.rows_offset = PREAMBLE + 4 * h.n_tokens
        size = self.file_size
        if size < self.rows_offset:
            self._fail(
                f"truncated token table: header promises {h.n_tokens} tokens ending at offset "
                f"{self.rows_offset}, file has {size} bytes",
                TruncatedHeader,
            )
        expected = self.rows_offset + h.n_chunk * h.chunk_nbytes
        if size < expected:
            have = (size - self.rows_offset) // h.chunk_nbytes
            self._fail(
                f"truncated rows: header promises {h.n_chunk} chunks ({expected} bytes), file has {size} "
                f"bytes, i.e. {have} complete chunks; chunk {have} is cut at offset {size}",
                TruncatedRows,
            )
        if size > expected:
            self._fail(
                f"{size - expected} unexpected bytes after the last chunk (offset {expected}); "
                f"row layout does not match n_ctx={h.n_ctx}, n_vocab={h.n_vocab}",
                RowLayoutError,
            )
        self.tokens = self._read_tokens(PREAMBLE)
        self.metadata = {"protocol": {"name": HALF_SCORED_CHUNKS, "n_ctx": h.n_ctx}}
        # Stored whole, read in frames: any rows can be read where they lie.
        self.frames = self._layout(default_frame_rows(h.row_width))
        self.form = PlainRows(h)
        self._map = mmap.mmap(self.fd, expected, prot=mmap.PROT_READ) if h.n_chunk else None

    def read_frame(self, index: int) -> Frame:
        h = self.header
        if not 0 <= index < self.frames.n_frames:
            raise IndexError(index)
        chunk, row0, n = self.frames.span(index)
        offset = self.rows_offset + chunk * h.chunk_nbytes + row0 * h.row_width * 2
        end = offset + n * h.row_width * 2
        size = os.fstat(self.fd).st_size  # a file cut since it was opened: an error, not SIGBUS
        if size < end:
            self._fail(f"chunk {chunk} cut short at offset {size}", TruncatedRows)
        return Frame(index, offset, memoryview(self._map)[offset:end])

    def stored_spans(self, chunk: int) -> list[tuple[int, int]]:
        h = self.header
        return [(self.rows_offset + chunk * h.chunk_nbytes, h.chunk_nbytes)]

    def close(self) -> None:
        if getattr(self, "_map", None) is not None:
            try:
                self._map.close()
            except BufferError:  # rows still in use keep the map open until they go
                pass
            self._map = None
        super().close()


class RawWriter(ResumableWriter):
    """Streams chunks into a llama.cpp raw file (which has nowhere to keep metadata)."""

    format_name = RAW_LAYOUT

    def _preamble(self, token_bytes: bytes) -> bytes:
        h = self.header
        return MAGIC + np.array([h.n_ctx, h.n_vocab, h.n_chunk], dtype="<i4").tobytes() + token_bytes

    def _chunk_ends(self, start: int, size: int) -> list[int]:
        n = min((size - start) // self.header.chunk_nbytes, self.header.n_chunk)
        return [start + (i + 1) * self.header.chunk_nbytes for i in range(n)]

    def _append_rows(self, rows: np.ndarray) -> None:
        self.out.write(np.ascontiguousarray(rows, dtype="<u2").tobytes())
