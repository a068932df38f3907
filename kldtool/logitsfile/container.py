"""kldtool's own base-file container: llama.cpp's codes, compressed per chunk, with metadata.

Layout (little-endian)::

    0   "KLDTOOL\\0"        8-byte magic (llama-perplexity rejects it cleanly: not "_logits_")
    8   u32 version          1: llama.cpp's chunks; 2: a window table (other protocols);
                             3: frames of at most R rows (a window table iff n_stream > 0)
    12  u32 n_ctx | u32 n_vocab | u32 n_chunk
    24  u32 transform        0: zstd of the rows' bytes; 1: zstd of (row heads, non-zero mask,
                             high bytes, low bytes of the non-zero codes); 2: zstd of top-K
                             records (codec/topk.py), K in the metadata's "keep"; 3: zstd of
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

import dataclasses
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

from kldtool.codec import DEFAULT_CLAMP, HEADER_SLOTS, Coding, check_clamp
from kldtool.errors import CorruptData, HeadMismatch, IncompleteFile, MetadataError, NotABaseFile, RowLayoutError, TruncatedHeader
from kldtool.logitsfile import hidden as hidden_states
from kldtool.logitsfile.frames import FrameLayout, default_frame_rows
from kldtool.logitsfile.header import BaseHeader
from kldtool.logitsfile.reader_base import BaseFileReader, Frame
from kldtool.logitsfile.writer_base import ResumableWriter
from kldtool.codec.topk import MIN_KEEP

MAGIC = b"KLDTOOL\x00"
END_MAGIC = b"KLDDONE\x00"
VERSIONS = (1, 2, 3)
PREAMBLE = 32
TRAILER = 32
PLAIN, MASKED_PLANES, TOPK, HIDDEN = 0, 1, 2, 3
DEFAULT_LEVEL = 3
SCATTER_BLOCK = 1 << 20  # codes per scatter step
MAX_FRAME_ROWS = 1 << 24


def _to_frame_bytes(rows: np.ndarray, transform: int) -> bytes:
    if transform == HIDDEN:  # already the stored dtype's bytes (hidden.raw_array)
        return np.ascontiguousarray(rows).tobytes()
    rows = np.ascontiguousarray(rows, dtype="<u2")
    if transform != MASKED_PLANES:
        return rows.tobytes()
    # About 60 % of codes are 0 (entries below the clamp floor): a bit mask of the non-zero
    # codes, then their high bytes (skewed, compressible) and low bytes (near-random), so
    # zstd sees each kind of data on its own. 0.43x the raw size on the fixture, vs 0.51x.
    codes = rows[:, HEADER_SLOTS:]
    mask = codes != 0
    nz = codes[mask]
    return b"".join([rows[:, :HEADER_SLOTS].tobytes(), np.packbits(mask).tobytes(),
                     (nz >> 8).astype(np.uint8).tobytes(), (nz & 0xFF).astype(np.uint8).tobytes()])


def _from_frame_bytes(data: bytes, transform: int, shape: tuple[int, int]) -> np.ndarray:
    n_rows, width = shape
    if transform != MASKED_PLANES:
        return np.frombuffer(data, dtype="<u2").reshape(shape)
    buf = np.frombuffer(data, dtype=np.uint8)
    head_len = n_rows * HEADER_SLOTS * 2
    n_codes = n_rows * (width - HEADER_SLOTS)
    mask_len = (n_codes + 7) // 8
    # Each step below is one pass over the chunk with no temporary copies: decoding is what
    # a GPU compare waits for (an 8B model consumes ~4 GB/s of rows).
    mask = np.unpackbits(buf[head_len:head_len + mask_len], count=n_codes).view(bool)
    nnz = int(np.count_nonzero(mask))
    if len(buf) != head_len + mask_len + 2 * nnz:
        raise ValueError(f"masked frame of {len(buf)} bytes, expected {head_len + mask_len + 2 * nnz}")
    values = np.empty(nnz, dtype="<u2")
    pairs = values.view(np.uint8).reshape(nnz, 2)  # little-endian: low byte first
    pairs[:, 1] = buf[head_len + mask_len:head_len + mask_len + nnz]
    pairs[:, 0] = buf[head_len + mask_len + nnz:]
    out = np.empty(shape, dtype="<u2")
    out[:, :HEADER_SLOTS] = buf[:head_len].view("<u2").reshape(n_rows, HEADER_SLOTS)
    # Scattered through index arrays (~4x faster than through the boolean mask), a block of
    # rows at a time so the int64 indices stay small whatever the chunk size.
    n_row_codes = width - HEADER_SLOTS
    step = min(n_rows, max(1, SCATTER_BLOCK // n_row_codes))
    block = np.empty(step * n_row_codes, dtype="<u2")
    done = 0
    for a in range(0, n_rows, step):
        b = min(a + step, n_rows)
        codes = block[:(b - a) * n_row_codes]
        codes[:] = 0
        idx = np.flatnonzero(mask[a * n_row_codes:b * n_row_codes])
        codes[idx] = values[done:done + len(idx)]
        done += len(idx)
        out[a:b, HEADER_SLOTS:] = codes.reshape(b - a, n_row_codes)
    return out


class ContainerReader(BaseFileReader):
    format_name = "kldtool"

    def _parse(self) -> None:
        size = self.file_size
        head = os.pread(self.fd, PREAMBLE, 0)
        if len(head) < PREAMBLE:
            self._fail(f"truncated header: {len(head)} bytes, need {PREAMBLE}", TruncatedHeader)
        version, n_ctx, n_vocab, n_chunk, transform, n_stream = (
            int(x) for x in np.frombuffer(head, dtype="<u4", count=6, offset=8))
        if version not in VERSIONS:
            self._fail(f"container version {version} at offset 8 is not supported (this kldtool reads "
                       f"{', '.join(map(str, VERSIONS))})", NotABaseFile)
        self.header = h = BaseHeader(n_ctx, n_vocab, n_chunk)
        if h.problems():
            self._fail(f"invalid header at offset 12: {'; '.join(h.problems())}", NotABaseFile)
        if transform not in (PLAIN, MASKED_PLANES, TOPK, HIDDEN):
            self._fail(f"unknown row transform {transform} at offset 24", NotABaseFile)
        self.transform = transform
        tabled = version == 2 or (version == 3 and n_stream > 0)
        tokens_end = PREAMBLE + 4 * (n_stream if tabled else h.n_tokens)
        if tabled:
            table_end = tokens_end + 32 * n_chunk
            table = os.pread(self.fd, 32 * n_chunk, tokens_end) if size >= table_end else b""
            if len(table) < 32 * n_chunk:
                self._fail(f"truncated window table at offset {tokens_end}: {n_chunk} windows, file has {size} bytes",
                           TruncatedHeader)
            rows = tuple(tuple(int(x) for x in r) for r in np.frombuffer(table, "<i8").reshape(n_chunk, 4))
            self.header = h = BaseHeader(n_ctx, n_vocab, n_chunk, rows, n_stream)
            if h.problems():
                self._fail(f"invalid window table at offset {tokens_end}: {'; '.join(h.problems())}", CorruptData)
            tokens_end = table_end
        if size < tokens_end:
            self._fail(f"truncated token table: {h.n_tokens} tokens end at offset {tokens_end}, file has {size} bytes", TruncatedHeader)
        trailer = os.pread(self.fd, TRAILER, size - TRAILER) if size >= tokens_end + TRAILER else b""
        if trailer[-8:] != END_MAGIC:
            self._fail(
                f"incomplete container: no completion marker at offset {max(size - 8, 0)} "
                f"(the run that wrote it did not finish)", IncompleteFile
            )
        index_offset, meta_len = (int(x) for x in np.frombuffer(trailer, dtype="<u8", count=2))
        crc, per_frame = (int(x) for x in np.frombuffer(trailer, dtype="<u4", count=2, offset=16))
        if (version == 3) != (per_frame > 0) or per_frame > MAX_FRAME_ROWS:
            self._fail(f"corrupt trailer at offset {size - 12}: {per_frame} rows per frame in a version "
                       f"{version} container", CorruptData)
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
            self._fail(f"corrupt index entry for {self._where(bad)} at offset {index_offset + 16 * bad}",
                       CorruptData)
        self.index = index
        try:
            self.metadata = json.loads(tail[index_len:].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._fail(f"metadata at offset {index_offset + index_len} does not parse: {e}", MetadataError)
        if not isinstance(self.metadata, dict):
            self._fail(f"metadata at offset {index_offset + index_len} is not a JSON object", MetadataError)
        if transform == TOPK:
            keep = self.metadata.get("keep")
            if not isinstance(keep, int) or not MIN_KEEP <= keep <= n_vocab:
                self._fail(f"top-K container with keep={keep!r} in its metadata (need {MIN_KEEP}..{n_vocab})",
                           MetadataError)
            self.header = h = dataclasses.replace(h, keep=keep)
        if "clamp" in self.metadata:
            self.header = h = dataclasses.replace(h, clamp=self._clamp(self.metadata["clamp"]))
        if transform == HIDDEN:
            self._check_hidden(int(ends.max()) if len(ends) else tokens_end, index_offset)
        self.tokens = self._read_tokens(PREAMBLE)

    def _check_hidden(self, frames_end: int, index_offset: int) -> None:
        """A hidden file's two metadata entries, checked before anything is sized from them."""
        hid, head = self.metadata.get("hidden"), self.metadata.get("head")
        try:
            dim, dtype = int(hid["dim"]), hid["dtype"]
            if dtype not in hidden_states.DTYPES or not 0 < dim <= 1 << 16:
                raise ValueError(f"dim {dim}, dtype {dtype!r}")
            v, d = (int(x) for x in head["shape"])
            if not hidden_states.is_head_dtype(head["dtype"]) or d != dim or v < self.header.n_vocab:
                raise ValueError(f"head of shape {head['shape']} and dtype {head['dtype']!r} for hidden states of "
                                 f"{dim} and a vocabulary of {self.header.n_vocab}")
            external = head.get("external")
            offset, length = (frames_end if external else int(head["offset"])), int(head["length"])
            if length != hidden_states.expected_head_length(head):
                raise ValueError(f"head section of {length} bytes, its shape needs "
                                 f"{hidden_states.expected_head_length(head)}")
            if external is not None and not isinstance(external, str):
                raise ValueError(f"external head source {external!r}")
            str(head["sha256"])
        except (KeyError, TypeError, ValueError) as e:
            self._fail(f"hidden-state container with unusable 'hidden'/'head' metadata: {e}", MetadataError)
        if offset < frames_end or offset + (0 if external else length) != index_offset:
            self._fail(f"head section at offset {offset}, {length} bytes, does not lie between the last frame "
                       f"({frames_end}) and the index ({index_offset})", CorruptData)
        self.hidden = {"dim": dim, "dtype": dtype, "itemsize": hidden_states.DTYPES[dtype][1]}
        self.replayer = hidden_states.Replayer(self._read_head)
        self.head_source = None  # --head-from: where an external head is now
        self.coding = Coding(self.metadata.get("codec", "grid"), self.header.clamp)

    def use_head(self, source: str | None) -> None:
        """A hidden-state file whose head is external: read it (from ``source`` if given, else
        the model the file names) and check its hash now, not at the first replay."""
        if self.transform != HIDDEN or not self.metadata["head"].get("external"):
            return super().use_head(source)
        self.head_source = source
        self.replayer.head()

    def _read_head(self) -> "hidden_states.OutputHead":
        import hashlib

        head = self.metadata["head"]
        if head.get("external"):
            from kldtool.logitsfile.head_source import load_head

            source = self.head_source or head["external"]
            loaded = load_head(source, head)
            got = loaded.describe(loaded.section())
            if (got["sha256"], got["dtype"], got["shape"]) != (head["sha256"], head["dtype"], head["shape"]):
                self._fail(f"the output head of {source} ({got['dtype']} {got['shape']}, sha256 {got['sha256'][:16]}...) "
                           f"is not the one this file was written with ({head['dtype']} {head['shape']}, sha256 "
                           f"{head['sha256'][:16]}...)", HeadMismatch)
            return loaded
        data = os.pread(self.fd, head["length"], head["offset"])
        if len(data) != head["length"] or hashlib.sha256(data).hexdigest() != head["sha256"]:
            self._fail(f"output head at offset {head['offset']} does not match its sha256 in the metadata "
                       f"(damaged or truncated)", CorruptData)
        return hidden_states.OutputHead.from_section(data, head)

    def _replay_rows(self, hidden):
        """Rows of the base logits replayed from hidden states: uint16 numpy rows from a numpy
        array (a GGUF head on the host, without torch), else int16 rows on ``hidden``'s device."""
        from kldtool.codec import encode_torch

        logits = self.replayer.logits(hidden)[:, :self.header.n_vocab]  # a padded head's extra rows
        if isinstance(logits, np.ndarray):
            from kldtool.codec.rows_compiled import encode_compiled as encode
        else:
            encode = encode_torch
        return encode(logits, self.coding.codec, self.coding.clamp)[0]

    def _clamp(self, value) -> float:
        """The clamp window a container's metadata records (absent: llama.cpp's 16 nats)."""
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{value!r} is not a number")
            return check_clamp(value)
        except ValueError as e:
            self._fail(f"metadata clamp: {e}", MetadataError)

    def _frame_size_range(self, index: int) -> tuple[int, int]:
        """Smallest and largest decoded size frame ``index`` can have (-1, unknown, is outside)."""
        h = self.header
        n_rows = self.frames.span(index)[2]
        if self.transform == HIDDEN:
            return n_rows * self.hidden["dim"] * self.hidden["itemsize"], n_rows * self.hidden["dim"] * self.hidden["itemsize"]
        if self.transform != MASKED_PLANES:
            return n_rows * h.row_width * 2, n_rows * h.row_width * 2
        n_codes = n_rows * (h.row_width - HEADER_SLOTS)
        fixed = n_rows * HEADER_SLOTS * 2 + (n_codes + 7) // 8
        return fixed, fixed + 2 * n_codes

    def read_frame(self, index: int) -> Frame:
        """Frame ``index`` decompressed but not yet rebuilt into rows (zstd releases the GIL,
        so prefetch threads run this in parallel)."""
        h = self.header
        if not 0 <= index < self.frames.n_frames:
            raise IndexError(index)
        where = self._where(index)
        offset, length = (int(x) for x in self.index[index])
        data = os.pread(self.fd, length, offset)
        # zstd allocates what the frame header declares: check that against what the header
        # allows first, so neither a damaged frame nor a lying header sizes an allocation.
        lo, hi = self._frame_size_range(index)
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as e:
            self._fail(f"corrupt zstd frame for {where} at offset {offset}: {e}", CorruptData)
        if not lo <= declared <= hi:
            self._fail(f"corrupt zstd frame for {where} at offset {offset}: declares {declared} bytes, "
                       f"n_ctx={h.n_ctx}, n_vocab={h.n_vocab} allow {lo}..{hi}", CorruptData)
        try:
            raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=hi)
        except zstandard.ZstdError as e:
            self._fail(f"corrupt zstd frame for {where} at offset {offset}: {e}", CorruptData)
        if self.transform != MASKED_PLANES and len(raw) != lo:
            self._fail(f"{where} at offset {offset} decodes to {len(raw)} bytes, expected {lo}", RowLayoutError)
        if self.transform == MASKED_PLANES:
            # Checked here, on the prefetch thread: a GPU rebuilding the rows then never has to
            # stop and report how many codes the mask holds.
            expected = _masked_size(raw, self.frames.span(index)[2], h.row_width)
            if len(raw) != expected:
                self._fail(f"corrupt {where} at offset {offset}: masked frame of {len(raw)} bytes, expected "
                           f"{expected}", CorruptData)
        return Frame(index, offset, raw)

    def frame_rows(self, frame: Frame) -> np.ndarray:
        if self.transform == HIDDEN:
            from kldtool.codec import rows_to_numpy

            if hidden_states.ggml_head.is_ggml(self.metadata["head"]["dtype"]):
                n, d = self.frames.span(frame.index)[2], self.hidden["dim"]
                return self._replay_rows(np.frombuffer(frame.data, dtype="<f4").reshape(n, d))
            return rows_to_numpy(self._replay_rows(self._hidden_of(frame.data, frame.index)))
        try:
            return _from_frame_bytes(frame.data, self.transform, (self.frames.span(frame.index)[2],
                                                                  self.header.row_width))
        except ValueError as e:
            self._fail(f"corrupt {self._where(frame.index)} at offset {frame.offset}: {e}", CorruptData)

    def _rebuild_torch(self, buf, index: int):
        if self.transform == HIDDEN:
            return self._replay_rows(self._hidden_of(buf, index))
        return _frame_to_torch(buf, self.transform, (self.frames.span(index)[2], self.header.row_width))

    def _hidden_of(self, data, index: int):
        return hidden_states.from_raw(data, self.hidden["dtype"], (self.frames.span(index)[2], self.hidden["dim"]))


def _masked_size(raw: bytes, n_rows: int, width: int) -> int:
    """The bytes a masked-planes frame of ``n_rows`` rows takes, by the codes its mask holds."""
    head_len = n_rows * HEADER_SLOTS * 2
    n_codes = n_rows * (width - HEADER_SLOTS)
    mask_len = (n_codes + 7) // 8
    if len(raw) < head_len + mask_len:
        return head_len + mask_len
    mask = np.frombuffer(raw, dtype=np.uint8, count=mask_len, offset=head_len)
    return head_len + mask_len + 2 * int(np.bitwise_count(mask).sum(dtype=np.int64))


def _frame_to_torch(buf, transform: int, shape: tuple[int, int]):
    """The torch twin of :func:`_from_frame_bytes`: a frame's bytes (a uint8 tensor on any
    device, its size already checked against its mask by read_frame) rebuilt into int16 rows
    there, without waiting for the device."""
    import torch

    n_rows, width = shape
    device = buf.device
    if transform != MASKED_PLANES:
        return buf.view(torch.int16).reshape(shape)
    head_len = n_rows * HEADER_SLOTS * 2
    n_codes = n_rows * (width - HEADER_SLOTS)
    mask_len = (n_codes + 7) // 8
    nnz = (buf.numel() - head_len - mask_len) // 2
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)  # packbits: first code = high bit
    mask = ((buf[head_len:head_len + mask_len, None] >> shifts) & 1).reshape(-1)[:n_codes].bool()
    planes = buf[head_len + mask_len:].view(2, nnz).to(torch.int32)
    values = (planes[0] << 8) | planes[1]
    values = torch.where(values > 32767, values - 65536, values).to(torch.int16)  # same bits, int16
    codes = torch.zeros(n_codes, dtype=torch.int16, device=device)
    codes.masked_scatter_(mask, values)
    rows = torch.empty(shape, dtype=torch.int16, device=device)
    rows[:, :HEADER_SLOTS] = buf[:head_len].view(torch.int16).reshape(n_rows, HEADER_SLOTS)
    rows[:, HEADER_SLOTS:] = codes.view(n_rows, width - HEADER_SLOTS)
    return rows


class ContainerWriter(ResumableWriter):
    """Compresses frames of ``frame_rows`` rows (0: a whole chunk each, the pre-frame layout)
    on worker threads (zstd releases the GIL) and appends them in order. A chunk's rows may
    come in blocks of any size: at most one frame's rows wait for the next block."""

    format_name = "kldtool"

    def __init__(self, path, header: BaseHeader, tokens: np.ndarray, metadata: dict | None = None,
                 level: int = DEFAULT_LEVEL, transform: int = MASKED_PLANES, threads: int = 2,
                 frame_rows: int | None = None):
        # Hidden states (metadata "hidden") or rows: top-K records, else the given transform.
        self.level = level
        self.transform = HIDDEN if (metadata or {}).get("hidden") else (TOPK if header.keep else transform)
        self.head = None  # hidden states: the OutputHead, stored by finish
        self.head_source = None  # ... or only named, with its hash (--head external)
        if frame_rows is None:
            frame_rows = default_frame_rows(header.row_width, replayed=self.transform == HIDDEN)
        self.frame_rows = frame_rows
        if not 0 <= self.frame_rows <= MAX_FRAME_ROWS:
            raise ValueError(f"{self.frame_rows} rows per frame: expected 0 .. {MAX_FRAME_ROWS}")
        self.layout = FrameLayout([header.rows_of(i) for i in range(header.n_chunk)], self.frame_rows)
        if header.keep:
            metadata = (metadata or {}) | {"keep": header.keep}
        if header.clamp != DEFAULT_CLAMP:
            metadata = (metadata or {}) | {"clamp": header.clamp}
        super().__init__(path, header, tokens, metadata)
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads))
        self.pending = []
        self.index: list[tuple[int, int]] = []
        self.waiting: list[np.ndarray] = []  # rows of the current frame so far
        self._frame_ends: list[int] = []

    def stored_width(self) -> int:
        return int(self.metadata["hidden"]["dim"]) if self.transform == HIDDEN else self.header.row_width

    def _preamble(self, token_bytes: bytes) -> bytes:
        h = self.header
        version = 3 if self.frame_rows else (1 if h.windows is None else 2)
        pre = np.array([version, h.n_ctx, h.n_vocab, h.n_chunk, self.transform,
                        0 if h.windows is None else h.n_stream], dtype="<u4")
        table = b"" if h.windows is None else np.array(h.windows, dtype="<i8").tobytes()
        return MAGIC + pre.tobytes() + token_bytes + table

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
        return cctx.compress(_to_frame_bytes(rows, self.transform))

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
        if self.transform != HIDDEN:
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
        if self.transform == HIDDEN:
            if self.head is None:
                raise ValueError("a hidden-state container needs its output head before it is finished")
            section = self.head.section()
            if self.head_source:  # --head external: the model is named, the head hashed, nothing stored
                self.metadata["head"] = self.head.describe(section) | {"external": self.head_source}
            else:
                self.metadata["head"] = self.head.describe(section) | {"offset": self.out.tell()}
                self.out.write(section)
        index = np.array(self.index, dtype="<u8").tobytes()
        meta = json.dumps(self.metadata, sort_keys=True).encode("utf-8")
        index_offset = self.out.tell()
        self.out.write(index + meta)
        trailer = np.array([index_offset, len(meta)], dtype="<u8").tobytes()
        trailer += np.array([zlib.crc32(index + meta), self.frame_rows], dtype="<u4").tobytes() + END_MAGIC
        self.out.write(trailer)

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
