"""The base rows of a few chunks read once and held, for runs that score the same windows again
and again (a recipe's candidates, attribute's units): every later run reads and decompresses no
frame. What is held is the stored codes (2 bytes per entry), on the engine's device."""

from __future__ import annotations

import numpy as np

from kldtool.logitsfile.prefetch import PrefetchedChunks


class HeldRows:
    def __init__(self, reader, chunks: list[int], device=None):
        self.header = reader.header
        source = PrefetchedChunks(reader, chunks, device=device)
        try:
            self._rows = {c: source.rows_torch(c, device) for c in chunks}
        finally:
            source.close()

    def nbytes(self) -> int:
        return sum(r.numel() * r.element_size() for r in self._rows.values())

    def rows_torch(self, index: int, device, start: int = 0, stop: int | None = None):
        rows = self._rows[index][start:stop]
        return rows if device is None or str(rows.device) == str(device) else rows.to(device)

    def parts_numpy(self, index: int, start: int = 0, stop: int | None = None) -> list[np.ndarray]:
        return [self._rows[index][start:stop].cpu().numpy().view(np.uint16)]

    def close(self) -> None:
        """Nothing to stop: the rows are kept until the holder drops them."""
