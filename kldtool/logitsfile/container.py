"""kldtool's own base-file container: llama.cpp's codes, compressed per chunk, with metadata.
This module holds its layout; container_reader.py and container_writer.py read and write it,
and transforms.py (replay.py for hidden states) the stored forms of its frames.

Layout (little-endian)::

    0   "KLDTOOL\\0"        8-byte magic (llama-perplexity rejects it cleanly: not "_logits_")
    8   u32 version          1: llama.cpp's chunks; 2: a window table (other protocols);
                             3: frames of at most R rows (a window table iff n_stream > 0)
    12  u32 n_ctx | u32 n_vocab | u32 n_chunk
    24  u32 transform        0: zstd of the rows' bytes; 1: zstd of (row heads, non-zero mask,
                             high bytes, low bytes of the non-zero codes); 2: zstd of top-K
                             records (codec/topk_records.py), K in the metadata's "keep"; 3: zstd of
                             final hidden states (hidden.py; dim and dtype in the metadata's
                             "hidden", the output head's section in its "head")
    28  u32 n_stream         with a window table: tokens in the stream (else 0: n_ctx * n_chunk)
    32  int32 tokens[n_ctx * n_chunk, or n_stream]
        with a window table: i64 (start, length, first, n_scored) per window
        zstd frames (with content size and checksum): versions 1-2 one per chunk; version 3
        ceil(rows / R) per chunk, each of R rows but the chunk's last (frames.py)
        transform 3: the output head's section (weight, bias), uncompressed
        index: one (u64 offset, u64 length) per frame
        metadata: UTF-8 JSON
    end-32: u64 index_offset | u64 metadata_length | u32 crc32(index + metadata) | u32 R (0 before
            version 3) | "KLDDONE\\0"

The trailer is the completion marker: it is written last, so an interrupted file has none.
Frames are independent, so they decode in any order and on several threads, and a long
window is written and read a few MiB at a time.
"""

from __future__ import annotations

import numpy as np

from kldtool.logitsfile.header import BaseHeader
from kldtool.logitsfile.transforms import ROWS, MaskedPlanes, TopKRecords, Transform

MAGIC = b"KLDTOOL\x00"
END_MAGIC = b"KLDDONE\x00"
VERSIONS = (1, 2, 3)
PREAMBLE = 32
TRAILER = 32
DEFAULT_LEVEL = 3
MAX_FRAME_ROWS = 1 << 24


def preamble(header: BaseHeader, transform: int, token_bytes: bytes, framed: bool) -> bytes:
    """Magic, version, sizes, the transform, the token table and the window table, if any."""
    h = header
    version = 3 if framed else (1 if h.windows is None else 2)
    pre = np.array(
        [version, h.n_ctx, h.n_vocab, h.n_chunk, transform, 0 if h.windows is None else h.n_stream], dtype="<u4"
    )
    table = b"" if h.windows is None else np.array(h.windows, dtype="<i8").tobytes()
    return MAGIC + pre.tobytes() + token_bytes + table


def trailer(index_offset: int, meta_len: int, crc: int, frame_rows: int) -> bytes:
    """The completion marker, written last."""
    return (
        np.array([index_offset, meta_len], dtype="<u8").tobytes()
        + np.array([crc, frame_rows], dtype="<u4").tobytes()
        + END_MAGIC
    )


def parse_trailer(data: bytes) -> tuple[int, int, int, int]:
    """(index offset, metadata length, crc32, rows per frame) of a trailer ending in END_MAGIC."""
    index_offset, meta_len = (int(x) for x in np.frombuffer(data, dtype="<u8", count=2))
    crc, per_frame = (int(x) for x in np.frombuffer(data, dtype="<u4", count=2, offset=16))
    return index_offset, meta_len, crc, per_frame


def form_for_writing(header: BaseHeader, metadata: dict, rows: type[Transform] = MaskedPlanes) -> Transform:
    """The stored form a writer uses: hidden states where the metadata describes them (replay.py),
    top-K records for a compact header, else ``rows``."""
    hidden = metadata.get("hidden")
    if hidden:
        from kldtool.logitsfile.replay import HiddenStates

        return HiddenStates(header, int(hidden["dim"]), hidden["dtype"])
    return TopKRecords(header) if header.keep else rows(header)


__all__ = [
    "MAGIC",
    "END_MAGIC",
    "VERSIONS",
    "PREAMBLE",
    "TRAILER",
    "DEFAULT_LEVEL",
    "MAX_FRAME_ROWS",
    "ROWS",
    "preamble",
    "trailer",
    "parse_trailer",
    "form_for_writing",
]
