"""Read (and decompress) the next chunks on worker threads while the engine runs the current one."""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import numpy as np


def iter_chunks(reader, indices: Iterable[int], ahead: int = 4, threads: int = 2) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (index, rows) in order, keeping up to ``ahead`` chunks in flight."""
    indices = iter(indices)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        queue: deque = deque()
        for i in indices:
            queue.append((i, pool.submit(reader.read_chunk, i)))
            if len(queue) >= ahead:
                break
        while queue:
            i, fut = queue.popleft()
            nxt = next(indices, None)
            if nxt is not None:
                queue.append((nxt, pool.submit(reader.read_chunk, nxt)))
            yield i, fut.result()


class PrefetchedChunks:
    """Base rows for an engine's ``score``: chunks asked for in order are read ``ahead``."""

    def __init__(self, reader, indices: Iterable[int], ahead: int = 4, threads: int = 2):
        self.path = reader.path
        self.header = reader.header
        self._it = iter_chunks(reader, indices, ahead=ahead, threads=threads)

    def rows(self, index: int) -> np.ndarray:
        got, rows = next(self._it)
        if got != index:
            raise RuntimeError(f"chunk {index} asked for out of order (next is {got})")
        return rows

    def close(self) -> None:
        self._it.close()
