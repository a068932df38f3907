"""Read (and decompress) the next frames on worker threads while the engine runs the current one."""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import numpy as np

from kldtool.codec import rows_to_torch
from kldtool.logitsfile.reader_base import stage_frame

CACHE_BYTES = 256 << 20  # rows a ChunkFeed keeps on its device for requests that ask again
# Rows a GPU feed reads ahead: an engine batch's worth (an 8B model's 4 windows of 1023 rows of
# a 128k vocabulary are 1 GiB), so they are on the device when its forward ends; with fewer, the
# device waits for the host after every forward. More decoding threads do not help: they feed
# rows faster, but compare was no faster and compare from hidden states slower (measured on
# H100s: docs/benchmarks.md, the GPU sessions).
GPU_AHEAD_BYTES = 1 << 30


def iter_chunks(
    reader, indices: Iterable[int], ahead: int = 4, threads: int = 2, read=None
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (index, read(index)) in order, keeping up to ``ahead`` reads in flight; ``read``
    (default ``reader.read_chunk``: whole chunks) is what the threads call per index."""
    for i, fut in submitted(indices, ahead, threads, read or reader.read_chunk):
        yield i, fut.result()


class _OnDemand:
    """A read done when its result is asked for, in the asking thread."""

    def __init__(self, read, index: int):
        self.read, self.index = read, index

    def result(self):
        return self.read(self.index)


def submitted(indices: Iterable[int], ahead: int, threads: int, read) -> Iterator[tuple[int, object]]:
    """(index, future of read(index)) in order, up to ``ahead`` reads in flight: the first
    ``next`` submits the first ``ahead`` reads and returns without waiting for any. With no
    threads, each read is done when its result is asked for."""
    if threads == 0:
        yield from ((i, _OnDemand(read, i)) for i in indices)
        return
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
            yield i, fut


def prefetch_plan(frame_nbytes: int, cpus: int | None = None, budget: int = 2 << 30) -> tuple[int, int]:
    """(frames ahead, threads): a GPU scores rows faster than one core decodes them (an 8B
    model on an H100 wants ~4 GB/s of rows), so half the cores decode, with up to two frames
    each in flight, as long as those fit ``budget`` bytes (one frame per window in files from
    before frames: 16k tokens of a 49k vocabulary are 1.5 GiB, so then down to one). Not more
    than half, at most 8: more threads decode faster but slow the thread that launches the
    forward, and compare with them (docs/benchmarks.md, the GPU sessions)."""
    threads = max(2, min(8, (cpus or os.cpu_count() or 2) // 2))
    ahead = max(1, min(2 * threads, budget // max(frame_nbytes, 1)))
    return ahead, min(threads, ahead)


def _loader(reader, device, copy_ahead: bool = False):
    """(what a thread runs per frame, what turns its result into int16 rows on ``device``).
    For a GPU the threads read, decompress and pin, and the rows are rebuilt on the device
    (``copy_ahead``: the threads also start the copy there, on a side stream); otherwise the
    threads decode the rows on the host."""
    if device is None or str(device).startswith("cpu"):
        return reader.read_frame_rows, rows_to_torch
    to = device if copy_ahead and str(device).startswith("cuda") else None
    return (lambda index: stage_frame(reader.read_frame(index), to)), reader.frame_to_torch


def _join(parts: list):
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(parts)


class PrefetchedChunks:
    """Base rows for an engine's ``score``: any rows of the chunks asked for in order (a
    window's blocks in order), its frames read ahead. For an engine on a GPU the threads only
    decompress; the rows are rebuilt on the device."""

    def __init__(
        self,
        reader,
        indices: Iterable[int],
        ahead: int | None = None,
        threads: int | None = None,
        device: str | None = None,
    ):
        self.path = reader.path
        self.header = reader.header
        self.frames = reader.frames
        # Frames read ahead are copied ahead too, beside the engine's forward (a few frames of
        # device memory); a ChunkFeed inside a server's worker keeps them on the host until asked.
        read, self._to_torch = _loader(reader, device, copy_ahead=True)
        plan_ahead, plan_threads = prefetch_plan(reader.frame_nbytes)
        if str(device).startswith("cuda"):
            plan_ahead = max(plan_ahead, GPU_AHEAD_BYTES // max(reader.frame_nbytes, 1))
        if reader.form.replayed and (device is None or str(device).startswith("cpu")):
            # Replaying hidden states is compute, not I/O: beside an engine that keeps every core
            # busy (llama.cpp's threads spin while they wait for each other) it would only slow
            # both down, so on the host each frame is replayed when the engine asks for it.
            plan_threads = 0
            reader.form.warm()
        frames = (k for i in indices for k in self.frames.of_chunk(i))
        self._it = submitted(frames, ahead or plan_ahead, threads or plan_threads, read)
        # The first reads start now, beside the engine's first forward rather than after it (a
        # hidden-state file's first frames also load its head there).
        self._next = next(self._it, None)
        self._held: tuple | None = None  # (frame, rows): the last frame, which the next block may share

    def _pop(self) -> tuple[int, object]:
        if self._next is None:
            raise StopIteration
        got, self._next = self._next, next(self._it, None)
        return got

    def _frame(self, k: int, convert):
        if self._held is None or self._held[0] != k:
            got, fut = self._pop()
            while got < k:  # a frame no block asked for (never, when every row is scored)
                got, fut = self._pop()
            if got != k:
                raise RuntimeError(f"frame {k} asked for out of order (next is {got})")
            self._held = (k, convert(fut.result()))
        return self._held[1]

    def _parts(self, index: int, start: int, stop: int | None, convert) -> list:
        stop = self.header.rows_of(index) if stop is None else stop
        return self.frames.cut(index, start, stop, lambda k: self._frame(k, convert))

    def rows_torch(self, index: int, device, start: int = 0, stop: int | None = None):
        """Rows start .. stop-1 of chunk ``index`` as an int16 tensor on ``device``."""
        return _join(self._parts(index, start, stop, lambda item: self._to_torch(item, device)))

    def parts_numpy(self, index: int, start: int = 0, stop: int | None = None) -> list[np.ndarray]:
        """Rows start .. stop-1 of chunk ``index``, uint16 on the host, as views of the frames
        that hold them, in order (a feed made for the host): no copy of the rows."""
        return self._parts(index, start, stop, lambda item: item)

    def close(self) -> None:
        self._it.close()


class ChunkFeed:
    """Rows of chunks asked for mostly in order but not strictly (vLLM's workers see a
    request's rows step by step, several requests a step), as tensors on ``device``: the
    frames asked for stay in a small cache, the ones after the last asked for are read on
    threads meanwhile."""

    def __init__(self, reader, device):
        self.reader, self.device = reader, device
        self.frames = reader.frames
        self._read, self._to_torch = _loader(reader, device)
        self.ahead, threads = prefetch_plan(reader.frame_nbytes)
        # As many frames as are read ahead, plus two, within CACHE_BYTES: the rows sit on the
        # engine's device beside the model, and a hidden-state file's frames replay into 4x a
        # row file's (at least three frames, as for a file of one frame per long window).
        self.keep = max(3, min(self.ahead + 2, CACHE_BYTES // max(reader.frame_nbytes, 1)))
        self._pool = ThreadPoolExecutor(max_workers=threads)
        self._pending: dict = {}
        self._cache: OrderedDict = OrderedDict()

    def _frame(self, k: int):
        if k in self._cache:
            self._cache.move_to_end(k)
            return self._cache[k]
        fut = self._pending.pop(k, None)
        rows = self._to_torch(fut.result() if fut is not None else self._read(k), self.device)
        self._cache[k] = rows
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        for j in range(k + 1, min(k + 1 + self.ahead, self.frames.n_frames)):
            if j not in self._pending and j not in self._cache:
                self._pending[j] = self._pool.submit(self._read, j)
        while len(self._pending) > 2 * self.ahead:  # oldest first: another request moved on
            self._pending.pop(next(iter(self._pending))).cancel()
        return rows

    def rows(self, chunk: int, start: int, stop: int):
        """Rows start .. stop-1 of chunk ``chunk`` on the feed's device."""
        return _join(self.frames.cut(chunk, start, stop, self._frame))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._cache.clear()
