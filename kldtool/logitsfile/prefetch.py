"""Read (and decompress) the next chunks on worker threads while the engine runs the current one."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import numpy as np

from kldtool.codec import rows_to_torch
from kldtool.logitsfile.reader_base import stage_frame


def iter_chunks(reader, indices: Iterable[int], ahead: int = 4, threads: int = 2,
                read=None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (index, rows) in order, keeping up to ``ahead`` chunks in flight; ``read``
    (default ``reader.read_chunk``) is what the threads call per chunk."""
    read = read or reader.read_chunk
    indices = iter(indices)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        queue: deque = deque()
        for i in indices:
            queue.append((i, pool.submit(read, i)))
            if len(queue) >= ahead:
                break
        while queue:
            i, fut = queue.popleft()
            nxt = next(indices, None)
            if nxt is not None:
                queue.append((nxt, pool.submit(read, nxt)))
            yield i, fut.result()


def prefetch_plan(chunk_nbytes: int, cpus: int | None = None, budget: int = 2 << 30) -> tuple[int, int]:
    """(chunks ahead, threads): a GPU scores rows faster than one core decodes them (an 8B
    model on an H100 wants ~4 GB/s of rows), so half the cores decode, with up to two chunks
    each in flight, as long as those fit ``budget`` bytes. Long windows make big chunks (16k
    tokens of a 49k vocabulary: 1.5 GiB of rows): then fewer are in flight, down to one."""
    threads = max(2, min(8, (cpus or os.cpu_count() or 2) // 2))
    ahead = max(1, min(2 * threads, budget // max(chunk_nbytes, 1)))
    return ahead, min(threads, ahead)


def _loader(reader, device):
    """(what a thread runs per chunk, what turns its result into int16 rows on ``device``).
    For a GPU the threads read, decompress and pin, and the rows are rebuilt on the device;
    otherwise the threads decode the rows on the host."""
    if device is None or str(device).startswith("cpu"):
        return reader.read_chunk, rows_to_torch
    return (lambda index: stage_frame(reader.read_frame(index))), reader.frame_to_torch


class PrefetchedChunks:
    """Base rows for an engine's ``score``, chunks asked for in order and read ahead. For an
    engine on a GPU the threads only decompress; the rows are rebuilt on the device."""

    def __init__(self, reader, indices: Iterable[int], ahead: int | None = None, threads: int | None = None,
                 device: str | None = None):
        self.path = reader.path
        self.header = reader.header
        read, self._to_torch = _loader(reader, device)
        plan_ahead, plan_threads = prefetch_plan(reader.header.chunk_nbytes)
        self._it = iter_chunks(reader, indices, ahead=ahead or plan_ahead, threads=threads or plan_threads, read=read)

    def _next(self, index: int):
        got, item = next(self._it)
        if got != index:
            raise RuntimeError(f"chunk {index} asked for out of order (next is {got})")
        return item

    def rows_torch(self, index: int, device):
        """Chunk ``index``'s rows as an int16 tensor on ``device``."""
        return self._to_torch(self._next(index), device)

    def rows_numpy(self, index: int) -> np.ndarray:
        """Chunk ``index``'s uint16 rows on the host (a feed made for the host device)."""
        return self._next(index)

    def close(self) -> None:
        self._it.close()


class ChunkFeed:
    """Rows of chunks asked for mostly in order but not strictly (vLLM's workers see a
    request's chunk step by step, several requests a step), as tensors on ``device``; the
    chunks after the last one asked for are read on threads meanwhile."""

    def __init__(self, reader, device):
        self.reader, self.device = reader, device
        self._read, self._to_torch = _loader(reader, device)
        self.ahead, threads = prefetch_plan(reader.header.chunk_nbytes)
        self._pool = ThreadPoolExecutor(max_workers=threads)
        self._pending: dict = {}
        self._last: tuple | None = None

    def rows(self, chunk: int):
        if self._last is not None and self._last[0] == chunk:
            return self._last[1]
        fut = self._pending.pop(chunk, None)
        item = fut.result() if fut is not None else self._read(chunk)
        for k in [k for k in self._pending if not chunk < k <= chunk + self.ahead]:
            self._pending.pop(k).cancel()
        for k in range(chunk + 1, min(chunk + 1 + self.ahead, self.reader.header.n_chunk)):
            if k not in self._pending:
                self._pending[k] = self._pool.submit(self._read, k)
        rows = self._to_torch(item, self.device)
        self._last = (chunk, rows)
        return rows

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
