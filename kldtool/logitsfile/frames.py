"""Frames: how a base file's rows are cut for storage and reading.

A window's rows are stored (container) or read (both layouts) as frames of at most R rows,
numbered across the file, so neither the writer nor a reader ever holds a whole long window:
16k tokens of a 49k vocabulary are 1.5 GiB of uint16 rows, a frame of R rows a few MiB.
R = 0 means one frame per window, the container's layout before frames existed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

FRAME_BYTES = 8 << 20  # raw bytes a default frame holds: big enough that zstd loses nothing
# A frame of hidden states is replayed as one product, which on the host runs at full speed only
# from a hundred-odd rows on (docs/benchmarks.md). Its rows exist only while they are reduced, one
# frame at a time, so it may stand for 4x the bytes.
REPLAYED_FRAME_BYTES = 4 * FRAME_BYTES


def default_frame_rows(row_width: int, replayed: bool = False) -> int:
    """Rows per frame so a frame is about FRAME_BYTES of uint16 rows, or REPLAYED_FRAME_BYTES
    for a frame of hidden states (``replayed``); at least 16 rows."""
    return max(16, (REPLAYED_FRAME_BYTES if replayed else FRAME_BYTES) // (2 * row_width))


class FrameLayout:
    """Frames of chunks of ``rows[i]`` rows, ``per_frame`` rows each (the last of a chunk
    may be shorter; 0: one frame per chunk)."""

    def __init__(self, rows: Sequence[int], per_frame: int):
        self.rows = np.asarray(rows, dtype=np.int64)
        self.per_frame = per_frame
        counts = np.ones_like(self.rows) if per_frame <= 0 else np.maximum(1, -(-self.rows // per_frame))
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # first frame of each chunk
        self.n_frames = int(self.first[-1])

    def of_chunk(self, chunk: int) -> range:
        return range(int(self.first[chunk]), int(self.first[chunk + 1]))

    def span(self, frame: int) -> tuple[int, int, int]:
        """(chunk, first row in the chunk, rows) of frame number ``frame``."""
        chunk = int(np.searchsorted(self.first, frame, side="right")) - 1
        if self.per_frame <= 0:
            return chunk, 0, int(self.rows[chunk])
        row0 = (frame - int(self.first[chunk])) * self.per_frame
        return chunk, row0, min(self.per_frame, int(self.rows[chunk]) - row0)

    def covering(self, chunk: int, start: int, stop: int) -> range:
        """The frames of ``chunk`` that hold its rows start .. stop-1."""
        f0 = int(self.first[chunk])
        if self.per_frame <= 0:
            return range(f0, f0 + 1)
        return range(f0 + start // self.per_frame, f0 + -(-stop // self.per_frame))

    def cut(self, chunk: int, start: int, stop: int, frame_rows) -> list:
        """Rows start .. stop-1 of ``chunk`` as slices of its frames' rows, in order;
        ``frame_rows(k)`` gives frame k's rows (read, cached or prefetched, as the caller keeps them)."""
        parts = []
        for k in self.covering(chunk, start, stop):
            _, row0, n = self.span(k)
            parts.append(frame_rows(k)[max(start - row0, 0) : min(stop - row0, n)])
        return parts

    @property
    def max_rows(self) -> int:
        top = int(self.rows.max())
        return top if self.per_frame <= 0 else min(top, self.per_frame)
