"""What both base-file readers share: the open descriptor, error wording, the token table."""

from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

import numpy as np

from kldtool.codec import rows_to_torch
from kldtool.errors import BaseFileError, CorruptData, UsageError
from kldtool.logitsfile.frames import FrameLayout
from kldtool.logitsfile.header import BaseHeader
from kldtool.logitsfile.transforms import Transform


class Frame(NamedTuple):
    """A frame (frames.py) as stored, before it is rebuilt into rows: its number, where it
    came from and its bytes (``bytes``, or a pinned host tensor once staged for a GPU)."""

    index: int
    offset: int
    data: object


class OnDevice(NamedTuple):
    """A frame's bytes copied to a GPU on a side stream, and the event that marks the copy done."""

    buf: object
    done: object


def stage_frame(frame: Frame, device=None) -> Frame:
    """The frame in pinned host memory, and for a CUDA ``device`` already on its way there:
    prefetch threads call this (torch releases the GIL while copying), so the copy runs on a
    side stream beside the forward instead of after it on the compute stream."""
    pinned = _host_bytes(frame.data).pin_memory()
    if device is None:
        return frame._replace(data=pinned)
    import torch

    stream = _copy_stream(torch.device(device))
    with torch.cuda.stream(stream):
        buf = pinned.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    return frame._replace(data=OnDevice(buf, done))


_COPY = threading.local()  # each prefetch thread's copy stream per device


def _copy_stream(device):
    """The calling thread's copy stream on ``device`` (a stream orders its copies; threads need
    not wait on each other's)."""
    import torch

    streams = _COPY.__dict__.setdefault("streams", {})
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in streams:
        streams[index] = torch.cuda.Stream(device=index)
    return streams[index]


def _on_device(data, device):
    """A frame's bytes on ``device``: a side-stream copy handed over to the current stream
    (which waits for it, and owns the buffer from then on), or copied now."""
    import torch

    if isinstance(data, OnDevice):
        current = torch.cuda.current_stream(data.buf.device)
        current.wait_event(data.done)
        data.buf.record_stream(current)
        return data.buf
    return _host_bytes(data).to(device, non_blocking=True)


def _host_bytes(data):
    import torch

    if isinstance(data, torch.Tensor):
        return data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only buffer: it is only ever read
        return torch.frombuffer(data, dtype=torch.uint8)


class BaseFileReader:
    format_name = "?"
    header: BaseHeader
    metadata: dict
    frames: FrameLayout  # how the rows are cut for reading, set by _parse
    form: Transform  # what a frame's bytes are (transforms.py), set by _parse

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            self.file_size = os.fstat(self.fd).st_size
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        raise NotImplementedError

    def use_head(self, source: str | None) -> None:
        """``compare --head-from``: only a hidden-state file with an external head takes one."""
        if source:
            raise UsageError(f"--head-from {source}: {self.path} does not name an external output head")

    def _fail(self, msg: str, cls: type[BaseFileError] = BaseFileError):
        raise cls(f"{self.path}: {msg}")

    def _read_tokens(self, offset: int) -> np.ndarray:
        """The int32 token table at ``offset``, every id checked against the vocabulary."""
        h = self.header
        tokens = np.frombuffer(os.pread(self.fd, 4 * h.n_tokens, offset), dtype="<i4").astype(np.int32)
        bad = np.nonzero((tokens < 0) | (tokens >= h.n_vocab))[0]
        if bad.size:
            i = int(bad[0])
            where = f" (chunk {i // h.n_ctx})" if h.windows is None else ""
            self._fail(
                f"token {int(tokens[i])} at offset {offset + 4 * i}{where} is outside the vocabulary of {h.n_vocab}",
                CorruptData,
            )
        return tokens

    def _layout(self, per_frame: int) -> FrameLayout:
        h = self.header
        return FrameLayout([h.rows_of(i) for i in range(h.n_chunk)], per_frame)

    def _where(self, frame: int) -> str:
        """A frame named for error messages: by its chunk, and its number when chunks have several."""
        chunk = self.frames.span(frame)[0]
        return f"chunk {chunk}" if self.frames.per_frame <= 0 else f"chunk {chunk} (frame {frame})"

    @property
    def frame_nbytes(self) -> int:
        """Bytes of the largest frame's rows: what a reader holds per frame in flight."""
        return self.frames.max_rows * self.header.row_width * 2

    def read_frame(self, index: int) -> Frame:
        """Frame ``index`` as stored (decompressed), checked; thread-safe."""
        raise NotImplementedError

    def stored_spans(self, chunk: int) -> list[tuple[int, int]]:
        """(offset, bytes) of what the file stores for window ``chunk``'s rows, as stored: all a
        run scoring that window reads beyond the header, tables and metadata (cluster/ships
        only these to a node that lacks the file)."""
        raise NotImplementedError

    def frame_rows(self, frame: Frame) -> np.ndarray:
        """uint16 rows of a frame, on the host."""
        try:
            return self.form.rows(frame.data, self.frames.span(frame.index)[2])
        except ValueError as e:
            self._fail(f"corrupt {self._where(frame.index)} at offset {frame.offset}: {e}", CorruptData)

    def read_frame_rows(self, index: int) -> np.ndarray:
        return self.frame_rows(self.read_frame(index))

    def read_rows(self, chunk: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """uint16 rows start .. stop-1 of chunk ``chunk``, reading only the frames that hold them."""
        stop = self.header.rows_of(chunk) if stop is None else stop
        parts = self.frames.cut(chunk, start, stop, self.read_frame_rows)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def read_chunk(self, index: int) -> np.ndarray:
        return self.read_rows(index)

    def frame_to_torch(self, frame: Frame, device):
        """int16 rows of ``frame`` on ``device``. For a GPU the frame's bytes are copied as
        they are and rebuilt into rows there: no host pass over the rows at all."""
        import torch

        if torch.device(device).type == "cpu":
            return rows_to_torch(self.frame_rows(frame), device)
        buf = _on_device(frame.data, device)
        try:
            return self._rebuild_torch(buf, frame.index)
        except ValueError as e:
            self._fail(f"corrupt {self._where(frame.index)} at offset {frame.offset}: {e}", CorruptData)

    def _rebuild_torch(self, buf, index: int):
        """Rows from a frame's bytes already on the device."""
        return self.form.rows_torch(buf, self.frames.span(index)[2])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
