"""How kldtool's container stores a frame's rows: one class per stored form (the container's
``transform`` field), each turning rows into a frame's bytes and back, on the host (numpy) and
on a device (torch), and bounding the bytes a frame may decode to before anything is sized
from them. The container's reader and writer hold one of these and never look at its kind.

- ``PlainRows`` (0): the uint16 rows' bytes.
- ``MaskedPlanes`` (1): row heads, a bit mask of the non-zero codes, their high bytes, their
  low bytes; most codes of a real row are 0 (entries below the clamp floor), and zstd sees each
  kind of data on its own, so it packs smaller than plain rows (docs/benchmarks.md, the figures
  behind the code).
- ``TopKRecords`` (2): compact top-K records (codec/topk_records.py), K in the metadata's ``keep``.
- ``HiddenStates`` (3, replay.py): final hidden states, replayed into rows through the file's
  output head.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kldtool.codec import HEADER_SLOTS
from kldtool.codec.topk_records import MIN_KEEP
from kldtool.errors import CorruptData, MetadataError, RowLayoutError
from kldtool.logitsfile.header import BaseHeader

SCATTER_BLOCK = 1 << 20  # codes per scatter step of the host's masked-planes decoder


class Transform:
    """A stored form for the rows of ``header`` (full rows, or top-K records)."""

    code = -1
    error = RowLayoutError  # a frame of another size was written for another row layout
    replayed = False  # rows computed from what is stored (hidden states), not stored themselves

    def __init__(self, header: BaseHeader):
        self.header = header

    @property
    def width(self) -> int:
        """Values per stored row (uint16 slots; a hidden state's dimensions)."""
        return self.header.row_width

    def metadata(self) -> dict:
        """What the container's metadata must record for a reader to rebuild this form."""
        return {}

    @classmethod
    def opened(
        cls, header: BaseHeader, metadata: dict, read_at, fail, frames_end: int, index_offset: int
    ) -> "Transform":
        """The form of a file being read, from its header and metadata (``read_at(offset, n)``
        reads the file, ``fail(message, error class)`` raises; ``frames_end`` and
        ``index_offset`` bound what may lie between the frames and the index)."""
        return cls(header)

    def frame_bytes(self, rows: np.ndarray) -> bytes:
        return np.ascontiguousarray(rows, dtype="<u2").tobytes()

    def size_range(self, n_rows: int) -> tuple[int, int]:
        """Smallest and largest decoded size of a frame of ``n_rows`` rows."""
        n = n_rows * self.width * 2
        return n, n

    def problem(self, data: bytes, n_rows: int) -> str | None:
        """Why a decoded frame cannot be this form's, or None (checked on the prefetch thread,
        so a device rebuilding rows never has to report back)."""
        lo, hi = self.size_range(n_rows)
        return None if lo <= len(data) <= hi else f"decodes to {len(data)} bytes, expected {lo}"

    def rows(self, data, n_rows: int) -> np.ndarray:
        """uint16 rows of a decoded frame, on the host."""
        return np.frombuffer(data, dtype="<u2").reshape(n_rows, self.width)

    def rows_torch(self, buf, n_rows: int):
        """int16 rows of a decoded frame whose bytes are a uint8 tensor, on its device."""
        import torch

        return buf.view(torch.int16).reshape(n_rows, self.width)

    def warm(self) -> None:
        """Load on a thread what the first frame's rows will need (nothing, for stored rows)."""


class PlainRows(Transform):
    code = 0


class MaskedPlanes(Transform):
    code = 1
    error = CorruptData  # its mask and its planes disagree

    def _lengths(self, n_rows: int) -> tuple[int, int, int]:
        n_codes = n_rows * (self.width - HEADER_SLOTS)
        return n_rows * HEADER_SLOTS * 2, (n_codes + 7) // 8, n_codes

    def frame_bytes(self, rows: np.ndarray) -> bytes:
        rows = np.ascontiguousarray(rows, dtype="<u2")
        codes = rows[:, HEADER_SLOTS:]
        mask = codes != 0
        nz = codes[mask]
        return b"".join(
            [
                rows[:, :HEADER_SLOTS].tobytes(),
                np.packbits(mask).tobytes(),
                (nz >> 8).astype(np.uint8).tobytes(),
                (nz & 0xFF).astype(np.uint8).tobytes(),
            ]
        )

    def size_range(self, n_rows: int) -> tuple[int, int]:
        head_len, mask_len, n_codes = self._lengths(n_rows)
        return head_len + mask_len, head_len + mask_len + 2 * n_codes

    def problem(self, data: bytes, n_rows: int) -> str | None:
        head_len, mask_len, _ = self._lengths(n_rows)
        if len(data) < head_len + mask_len:
            return super().problem(data, n_rows)
        mask = np.frombuffer(data, dtype=np.uint8, count=mask_len, offset=head_len)
        expected = head_len + mask_len + 2 * int(np.bitwise_count(mask).sum(dtype=np.int64))
        return None if len(data) == expected else f"masked frame of {len(data)} bytes, expected {expected}"

    def rows(self, data, n_rows: int) -> np.ndarray:
        buf = np.frombuffer(data, dtype=np.uint8)
        head_len, mask_len, n_codes = self._lengths(n_rows)
        # Each step below is one pass over the frame with no temporary copies.
        mask = np.unpackbits(buf[head_len : head_len + mask_len], count=n_codes).view(bool)
        nnz = int(np.count_nonzero(mask))
        if len(buf) != head_len + mask_len + 2 * nnz:
            raise ValueError(f"masked frame of {len(buf)} bytes, expected {head_len + mask_len + 2 * nnz}")
        values = np.empty(nnz, dtype="<u2")
        pairs = values.view(np.uint8).reshape(nnz, 2)  # little-endian: low byte first
        pairs[:, 1] = buf[head_len + mask_len : head_len + mask_len + nnz]
        pairs[:, 0] = buf[head_len + mask_len + nnz :]
        out = np.empty((n_rows, self.width), dtype="<u2")
        out[:, :HEADER_SLOTS] = buf[:head_len].view("<u2").reshape(n_rows, HEADER_SLOTS)
        # Scattered through index arrays (faster than through the boolean mask), a block of
        # rows at a time so the int64 indices stay small whatever the frame's size.
        n_row_codes = self.width - HEADER_SLOTS
        step = min(n_rows, max(1, SCATTER_BLOCK // n_row_codes))
        block = np.empty(step * n_row_codes, dtype="<u2")
        done = 0
        for a in range(0, n_rows, step):
            b = min(a + step, n_rows)
            codes = block[: (b - a) * n_row_codes]
            codes[:] = 0
            idx = np.flatnonzero(mask[a * n_row_codes : b * n_row_codes])
            codes[idx] = values[done : done + len(idx)]
            done += len(idx)
            out[a:b, HEADER_SLOTS:] = codes.reshape(b - a, n_row_codes)
        return out

    def rows_torch(self, buf, n_rows: int):
        """The rows rebuilt where ``buf`` lies, without waiting for the device: the frame's size
        was checked against its mask when it was decoded (:meth:`problem`)."""
        import torch

        device = buf.device
        head_len, mask_len, n_codes = self._lengths(n_rows)
        nnz = (buf.numel() - head_len - mask_len) // 2
        shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=device)  # packbits: first code = high bit
        mask = ((buf[head_len : head_len + mask_len, None] >> shifts) & 1).reshape(-1)[:n_codes].bool()
        planes = buf[head_len + mask_len :].view(2, nnz).to(torch.int32)
        values = (planes[0] << 8) | planes[1]
        values = torch.where(values > 32767, values - 65536, values).to(torch.int16)  # same bits, int16
        codes = torch.zeros(n_codes, dtype=torch.int16, device=device)
        codes.masked_scatter_(mask, values)
        rows = torch.empty((n_rows, self.width), dtype=torch.int16, device=device)
        rows[:, :HEADER_SLOTS] = buf[:head_len].view(torch.int16).reshape(n_rows, HEADER_SLOTS)
        rows[:, HEADER_SLOTS:] = codes.view(n_rows, self.width - HEADER_SLOTS)
        return rows


class TopKRecords(Transform):
    code = 2

    def metadata(self) -> dict:
        return {"keep": self.header.keep}

    @classmethod
    def opened(
        cls, header: BaseHeader, metadata: dict, read_at, fail, frames_end: int, index_offset: int
    ) -> "Transform":
        keep = metadata.get("keep")
        if isinstance(keep, bool) or not isinstance(keep, int) or not MIN_KEEP <= keep <= header.n_vocab:
            fail(
                f"top-K container with keep={keep!r} in its metadata (need {MIN_KEEP}..{header.n_vocab})", MetadataError
            )
        return cls(dataclasses.replace(header, keep=keep))


ROWS = {t.code: t for t in (PlainRows, MaskedPlanes, TopKRecords)}
HIDDEN_CODE = 3
CODES = (*ROWS, HIDDEN_CODE)
