"""The routing section of kldtool's container (docs/file-formats.md, "Routing"): per chunk, one
zstd frame of the chunk's expert ids (u8, or u16 beyond 256 experts) then the probabilities of
those ids (float16), each n_rows x layers x k, stored after the row frames; the metadata's
"routing" entry gives the shape and each frame's (offset, length)."""

from __future__ import annotations

import os

import numpy as np
import zstandard

from kldtool.errors import CorruptData, MetadataError
from kldtool.routing.rows import PROB_DTYPE, Routed, RouterShape

LEVEL = 3


class RoutingSection:
    """The writer's side: each chunk's frame is compressed as it comes and written at finish."""

    name = "routing"

    def __init__(self, shape: RouterShape, rows_of):
        self.shape, self.rows_of = shape, rows_of
        self.frames: dict[int, bytes] = {}

    def add(self, chunk: int, routed: Routed) -> None:
        s, n = self.shape, self.rows_of(chunk)
        want = (n, len(s.layers), s.k)
        if routed.ids.shape != want:
            raise ValueError(f"routing of chunk {chunk + 1}: {routed.ids.shape} ids, expected {want}")
        data = routed.ids.astype(s.id_dtype).tobytes() + routed.probs.astype(PROB_DTYPE).tobytes()
        self.frames[chunk] = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(data)

    @classmethod
    def copied(cls, stored: "RoutingReader") -> "RoutingSection":
        """Another file's section, frame for frame (``convert``), each frame checked on the way."""
        section = cls(stored.shape, stored.reader.header.rows_of)
        for c, (offset, length) in enumerate(stored.frames):
            stored.chunk(c)
            section.frames[c] = os.pread(stored.reader.fd, length, offset)
        return section

    def write(self, out, n_chunk: int) -> dict:
        """Append the frames in chunk order to ``out``; the metadata entry that finds them."""
        missing = [c + 1 for c in range(n_chunk) if c not in self.frames]
        if missing:
            raise ValueError(f"routing of chunks {missing[:5]} was never recorded")
        where = []
        for c in range(n_chunk):
            where.append([out.tell(), len(self.frames[c])])
            out.write(self.frames[c])
        return self.shape.describe() | {"frames": where}


class RoutingReader:
    """The reading side, over an open container: ``shape`` is None for a file without routing."""

    def __init__(self, reader):
        self.reader, self.shape = reader, None
        meta = reader.metadata.get("routing")
        if meta is None:
            return
        lo, hi = getattr(reader, "sections_span", (0, 0))
        try:
            shape = RouterShape.from_metadata(meta)
            frames = [(int(a), int(b)) for a, b in meta["frames"]]
        except (KeyError, TypeError, ValueError) as e:
            reader._fail(f"unusable 'routing' metadata: {e}", MetadataError)
        if len(frames) != reader.header.n_chunk:
            reader._fail(
                f"'routing' metadata lists {len(frames)} frames for {reader.header.n_chunk} chunks", MetadataError
            )
        for c, (a, b) in enumerate(frames):
            if a < lo or b < 1 or a + b > hi:
                reader._fail(
                    f"routing frame of chunk {c + 1} at offset {a}, {b} bytes, lies outside {lo}..{hi}", CorruptData
                )
        self.shape, self.frames = shape, frames

    def chunk(self, c: int) -> Routed:
        s, n = self.shape, self.reader.header.rows_of(c)
        cells = n * len(s.layers) * s.k
        size = cells * (s.id_dtype.itemsize + PROB_DTYPE.itemsize)
        offset, length = self.frames[c]
        data = os.pread(self.reader.fd, length, offset)
        try:
            declared = zstandard.frame_content_size(data)
            if declared != size:  # checked before zstd allocates what the frame declares
                raise zstandard.ZstdError(f"declares {declared} bytes, {n} rows need {size}")
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
        except zstandard.ZstdError as e:
            self.reader._fail(f"corrupt routing frame of chunk {c + 1} at offset {offset}: {e}", CorruptData)
        split = cells * s.id_dtype.itemsize
        ids = np.frombuffer(raw[:split], s.id_dtype).reshape(n, len(s.layers), s.k)
        if ids.size and int(ids.max()) >= s.n_experts:
            self.reader._fail(
                f"corrupt routing frame of chunk {c + 1} at offset {offset}: expert id {int(ids.max())} "
                f"of {s.n_experts}",
                CorruptData,
            )
        probs = np.frombuffer(raw[split:], PROB_DTYPE).reshape(ids.shape).astype(np.float32)
        return Routed(ids.astype(np.int16), probs)
