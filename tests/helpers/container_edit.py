"""Rewriting a finished container's metadata (with a checksum that holds for the new bytes), for
the tests of what a reader makes of metadata it cannot use."""

from __future__ import annotations

import zlib

import numpy as np

from kldtool.logitsfile import container


def container_tail(data: bytes):
    """(index_offset, index bytes, metadata bytes) of a complete container."""
    index_offset, meta_len = (int(x) for x in np.frombuffer(data[-container.TRAILER :], "<u8", 2))
    meta_start = len(data) - container.TRAILER - meta_len
    return index_offset, data[index_offset:meta_start], data[meta_start : -container.TRAILER]


def with_metadata(data: bytes, meta: bytes) -> bytes:
    """The container with other metadata bytes and a checksum that holds for them."""
    index_offset, index, _ = container_tail(data)
    trailer = np.array([index_offset, len(meta)], "<u8").tobytes()
    per_frame = int(np.frombuffer(data[-12:-8], "<u4")[0])  # the trailer's rows per frame, kept
    trailer += np.array([zlib.crc32(index + meta), per_frame], "<u4").tobytes() + container.END_MAGIC
    return data[:index_offset] + index + meta + trailer
