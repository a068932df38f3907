"""Reading kldtool's container (layout in container.py): every number the file holds is checked
against the file's size and the header before anything is sized from it, and each error names
its offset. The frames' stored form (transforms.py, replay.py) turns their bytes into rows."""

from __future__ import annotations

import dataclasses
import json
import os
import zlib

import numpy as np
import zstandard

from kldtool.codec import check_clamp
from kldtool.errors import CorruptData, IncompleteFile, MetadataError, NotABaseFile, TruncatedHeader
from kldtool.logitsfile.container import END_MAGIC, MAX_FRAME_ROWS, PREAMBLE, TRAILER, VERSIONS, parse_trailer
from kldtool.logitsfile.header import CONTAINER, BaseHeader
from kldtool.logitsfile.reader_base import BaseFileReader, Frame
from kldtool.logitsfile.transforms import CODES, ROWS


class ContainerReader(BaseFileReader):
    format_name = CONTAINER

    def _parse(self) -> None:
        transform, tokens_end = self._preamble()
        index_offset = self._trailer(tokens_end)
        self._metadata()
        frames_end = int((self.index[:, 0] + self.index[:, 1]).max()) if len(self.index) else tokens_end
        self.form = _forms()[transform].opened(
            self.header,
            self.metadata,
            lambda offset, n: os.pread(self.fd, n, offset),
            self._fail,
            frames_end,
            index_offset,
        )
        self.header = self.form.header  # a top-K file's K comes from its metadata
        self.sections_span = (frames_end, index_offset)  # where sections (routing) may lie
        self.tokens = self._read_tokens(PREAMBLE)

    def _preamble(self) -> tuple[int, int]:
        """(the transform, where the token and window tables end); sets the header."""
        size = self.file_size
        head = os.pread(self.fd, PREAMBLE, 0)
        if len(head) < PREAMBLE:
            self._fail(f"truncated header: {len(head)} bytes, need {PREAMBLE}", TruncatedHeader)
        version, n_ctx, n_vocab, n_chunk, transform, n_stream = (
            int(x) for x in np.frombuffer(head, dtype="<u4", count=6, offset=8)
        )
        if version not in VERSIONS:
            self._fail(
                f"container version {version} at offset 8 is not supported (this kldtool reads "
                f"{', '.join(map(str, VERSIONS))})",
                NotABaseFile,
            )
        self.version = version
        self.header = h = BaseHeader(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk)
        if h.problems():
            self._fail(f"invalid header at offset 12: {'; '.join(h.problems())}", NotABaseFile)
        if transform not in CODES:
            self._fail(f"unknown row transform {transform} at offset 24", NotABaseFile)
        tabled = version == 2 or (version == 3 and n_stream > 0)
        tokens_end = PREAMBLE + 4 * (n_stream if tabled else h.n_tokens)
        if tabled:
            table_end = tokens_end + 32 * n_chunk
            table = os.pread(self.fd, 32 * n_chunk, tokens_end) if size >= table_end else b""
            if len(table) < 32 * n_chunk:
                self._fail(
                    f"truncated window table at offset {tokens_end}: {n_chunk} windows, file has {size} bytes",
                    TruncatedHeader,
                )
            rows = tuple(tuple(int(x) for x in r) for r in np.frombuffer(table, "<i8").reshape(n_chunk, 4))
            self.header = h = BaseHeader(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk, windows=rows, n_stream=n_stream)
            if h.problems():
                self._fail(f"invalid window table at offset {tokens_end}: {'; '.join(h.problems())}", CorruptData)
            tokens_end = table_end
        if size < tokens_end:
            self._fail(
                f"truncated token table: {h.n_tokens} tokens end at offset {tokens_end}, file has {size} bytes",
                TruncatedHeader,
            )
        return transform, tokens_end

    def _trailer(self, tokens_end: int) -> int:
        """The index offset; sets the frames and the index, and keeps the metadata's bytes."""
        size = self.file_size
        trailer = os.pread(self.fd, TRAILER, size - TRAILER) if size >= tokens_end + TRAILER else b""
        if trailer[-8:] != END_MAGIC:
            self._fail(
                f"incomplete container: no completion marker at offset {max(size - 8, 0)} "
                f"(the run that wrote it did not finish)",
                IncompleteFile,
            )
        index_offset, meta_len, crc, per_frame = parse_trailer(trailer)
        if (self.version == 3) != (per_frame > 0) or per_frame > MAX_FRAME_ROWS:
            self._fail(
                f"corrupt trailer at offset {size - 12}: {per_frame} rows per frame in a version "
                f"{self.version} container",
                CorruptData,
            )
        self.frames = self._layout(per_frame)
        index_len = 16 * self.frames.n_frames
        if index_offset < tokens_end or index_offset + index_len + meta_len + TRAILER != size:
            self._fail(f"corrupt trailer at offset {size - TRAILER}: index/metadata do not fit the file", CorruptData)
        tail = os.pread(self.fd, index_len + meta_len, index_offset)
        if zlib.crc32(tail) != crc:
            self._fail(f"corrupt index or metadata (checksum mismatch) at offset {index_offset}", CorruptData)
        index = np.frombuffer(tail[:index_len], dtype="<u8").reshape(-1, 2).astype(np.int64)
        ends = index[:, 0] + index[:, 1]
        if (index[:, 0] < tokens_end).any() or (ends > index_offset).any():
            bad = int(np.nonzero((index[:, 0] < tokens_end) | (ends > index_offset))[0][0])
            self._fail(f"corrupt index entry for {self._where(bad)} at offset {index_offset + 16 * bad}", CorruptData)
        self.index = index
        self._meta_bytes, self._meta_offset = tail[index_len:], index_offset + index_len
        return index_offset

    def _metadata(self) -> None:
        """The metadata, and the clamp window it may record for the header."""
        try:
            self.metadata = json.loads(self._meta_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._fail(f"metadata at offset {self._meta_offset} does not parse: {e}", MetadataError)
        if not isinstance(self.metadata, dict):
            self._fail(f"metadata at offset {self._meta_offset} is not a JSON object", MetadataError)
        if "clamp" in self.metadata:
            self.header = dataclasses.replace(self.header, clamp=self._clamp(self.metadata["clamp"]))

    def _clamp(self, value) -> float:
        """The clamp window a container's metadata records (absent: llama.cpp's 16 nats)."""
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{value!r} is not a number")
            return check_clamp(value)
        except ValueError as e:
            self._fail(f"metadata clamp: {e}", MetadataError)

    def use_head(self, source: str | None) -> None:
        """A hidden-state file whose head is external: read it (from ``source`` if given, else
        the model the file names) and check its hash now, not at the first replay."""
        if not getattr(self.form, "use_head", lambda s: False)(source):
            super().use_head(source)

    def stored_spans(self, chunk: int) -> list[tuple[int, int]]:
        return [(int(self.index[f][0]), int(self.index[f][1])) for f in self.frames.of_chunk(chunk)]

    def read_frame(self, index: int) -> Frame:
        """Frame ``index`` decompressed and checked, not yet rebuilt into rows (zstd releases the
        GIL, so prefetch threads run this in parallel)."""
        h = self.header
        if not 0 <= index < self.frames.n_frames:
            raise IndexError(index)
        where = self._where(index)
        offset, length = (int(x) for x in self.index[index])
        data = os.pread(self.fd, length, offset)
        # zstd allocates what the frame header declares: check that against what the header
        # allows first, so neither a damaged frame nor a lying header sizes an allocation.
        lo, hi = self.form.size_range(self.frames.span(index)[2])
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as e:
            self._fail(f"corrupt zstd frame for {where} at offset {offset}: {e}", CorruptData)
        if not lo <= declared <= hi:
            self._fail(
                f"corrupt zstd frame for {where} at offset {offset}: declares {declared} bytes, "
                f"n_ctx={h.n_ctx}, n_vocab={h.n_vocab} allow {lo}..{hi}",
                CorruptData,
            )
        try:
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=hi)
        except zstandard.ZstdError as e:
            self._fail(f"corrupt zstd frame for {where} at offset {offset}: {e}", CorruptData)
        problem = self.form.problem(raw, self.frames.span(index)[2])
        if problem:
            self._fail(f"corrupt {where} at offset {offset}: {problem}", self.form.error)
        return Frame(index, offset, raw)


def _forms() -> dict:
    """Every stored form by its code: the row forms, and hidden states (replayed through a head)."""
    from kldtool.logitsfile.replay import HiddenStates

    return {**ROWS, HiddenStates.code: HiddenStates}
