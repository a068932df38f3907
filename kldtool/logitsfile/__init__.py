"""Base files: llama.cpp's raw layout and kldtool's compressed container, behind one reader API
(``BaseFile``). A writer (``create_writer``) has ``write_rows(block)`` + ``end_chunk(nll)`` (or
``write_chunk(rows, nll)``), ``finish(metadata)`` and ``abort()``.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from kldtool.codec import DEFAULT_CLAMP
from kldtool.errors import BaseFileError, TruncatedHeader, UsageError
from kldtool.logitsfile import container, raw
from kldtool.logitsfile.frames import FrameLayout
from kldtool.logitsfile.header import CONTAINER, RAW_LAYOUT, BaseHeader
from kldtool.logitsfile.prefetch import iter_chunks
from kldtool.logitsfile.reader_base import Frame
from kldtool.logitsfile.transforms import Transform
from kldtool.text.protocols import HALF_SCORED_CHUNKS

FORMATS = (CONTAINER, RAW_LAYOUT)


class BaseFile(Protocol):
    """What every reader of a base file offers (reader_base.py); reads are thread-safe."""

    path: str
    format_name: str
    header: BaseHeader
    tokens: np.ndarray  # int32: n_ctx * n_chunk, or the window table's stream
    metadata: dict
    file_size: int
    frames: FrameLayout  # how the rows are cut for reading
    form: Transform  # what a frame's bytes are (transforms.py)

    @property
    def frame_nbytes(self) -> int: ...

    def read_rows(self, chunk: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """uint16 rows start .. stop-1 of ``chunk``, reading only the frames that hold them."""

    def read_chunk(self, index: int) -> np.ndarray: ...

    def read_frame(self, index: int) -> Frame: ...

    def frame_rows(self, frame: Frame) -> np.ndarray: ...

    def frame_to_torch(self, frame: Frame, device): ...

    def use_head(self, source: str | None) -> None: ...

    def close(self) -> None: ...


__all__ = [
    "BaseFile",
    "BaseHeader",
    "open_base_file",
    "create_writer",
    "check_layout",
    "iter_chunks",
    "frame_facts",
    "FORMATS",
]


def frame_facts(reader) -> dict:
    """How a reader cuts the file's rows: what one frame in flight costs on the host (and,
    for a GPU engine, on the device)."""
    f = reader.frames
    return {
        "frames": f.n_frames,
        "rows_per_frame": f.per_frame or "window",
        "largest_frame_rows": f.max_rows,
        "largest_frame_bytes": reader.frame_nbytes,
    }


def open_base_file(path: str | os.PathLike) -> BaseFile:
    """Open a base file of either format, validating it before anything is sized from it; or the
    base file of a reference pack (a directory, or a hub dataset's name found in the local hub
    cache: pack.py), every byte of the pack verified first."""
    p = os.fspath(path)
    from kldtool.logitsfile.pack import find_pack, is_pack

    p = find_pack(p) or p
    if is_pack(p):
        return _open_pack(p)
    try:
        with open(p, "rb") as f:
            magic = f.read(8)
    except FileNotFoundError:
        raise BaseFileError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise BaseFileError(f"{p}: is a directory, not a base file") from None
    except OSError as e:
        raise BaseFileError(f"{p}: cannot read ({e.strerror})") from None
    if not magic:
        raise TruncatedHeader(f"{p}: empty file (0 bytes)")
    if container.MAGIC.startswith(magic):
        from kldtool.logitsfile.container_reader import ContainerReader

        return ContainerReader(p)
    return raw.RawReader(p)


def _open_pack(path: str) -> BaseFile:
    """The base file of the pack at ``path``, opened through the descriptor verify_pack hashed
    (/proc/self/fd names that very file, not the path again); named in messages by its path."""
    from kldtool.logitsfile.pack import verify_pack

    manifest, fd = verify_pack(path)
    try:
        via = f"/proc/self/fd/{fd}"
        reader = open_base_file(via if os.path.exists(via) else os.path.join(path, manifest["base_file"]))
    finally:
        os.close(fd)
    reader.path = os.path.join(path, manifest["base_file"])
    return reader


def check_layout(
    fmt: str, protocol: str, keep: int | None = None, clamp: float = DEFAULT_CLAMP, frame_rows: int | None = None
) -> None:
    """llama.cpp's raw layout has no window table or frames, only full rows and a 16-nat
    window: only the llamacpp protocol's chunks of such rows fit it."""
    if frame_rows is not None and not 0 <= frame_rows <= container.MAX_FRAME_ROWS:
        raise UsageError(f"--frame-rows {frame_rows}: expected 0 .. {container.MAX_FRAME_ROWS}")
    if fmt == RAW_LAYOUT and frame_rows is not None:
        raise UsageError("--frame-rows: llama.cpp's raw layout stores rows unframed; use --format kldtool")
    if fmt == RAW_LAYOUT and protocol != HALF_SCORED_CHUNKS:
        raise UsageError(
            f"--format llamacpp holds only --protocol llamacpp's chunks, not {protocol}; use --format kldtool"
        )
    if fmt == RAW_LAYOUT and keep:
        raise UsageError(f"--format llamacpp holds full rows only, not the top-{keep} entries; use --format kldtool")
    if fmt == RAW_LAYOUT and clamp != DEFAULT_CLAMP:
        raise UsageError(
            f"--format llamacpp holds a {DEFAULT_CLAMP:g}-nat clamp window only, not {clamp:g}; use --format kldtool"
        )


def create_writer(
    path,
    fmt: str,
    header: BaseHeader,
    tokens,
    metadata: dict | None = None,
    settings: dict | None = None,
    resume: bool = False,
    frame_rows: int | None = None,
):
    """A writer on the locked partial file beside ``path``. Started afresh (with ``settings``
    journaled for a later resume) unless ``resume``: then the caller recovers and keeps.
    ``frame_rows``: the container's rows per frame (None: about 8 MiB; 0: one per chunk)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    name = (
        HALF_SCORED_CHUNKS
        if header.windows is None
        else (metadata or {}).get("protocol", {}).get("name", "a window table")
    )
    check_layout(fmt, name, header.keep, header.clamp, frame_rows)
    if fmt == CONTAINER:
        from kldtool.logitsfile.container_writer import ContainerWriter

        writer = ContainerWriter(path, header, tokens, metadata, frame_rows=frame_rows)
    else:
        writer = raw.RawWriter(path, header, tokens, metadata)
    if not resume:
        writer.start(settings)
    return writer
