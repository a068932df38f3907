"""``sweep --ray --ship-base``: the base file through Ray's object store, for nodes that do not
mount it; each node fetches only the windows its turns score.

The driver puts the file in two kinds of pieces: its frame, everything but the windows' stored
rows (header, token and window tables, metadata, index, an inline head), and one piece per
window (its frames as stored), each with a sha256. A node keeps one copy of the file in its
temporary directory: a sparse file of the full size holding the frame and the windows fetched so
far, beside a list of those windows. A turn adds the windows it will score that the copy lacks
(under a lock, checked against their digests, synced before they are listed) and opens the copy;
a reader reads only the windows it scores, so the holes are never read.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np


def _sha(parts) -> str:
    h = hashlib.sha256()
    for offset, data in parts:
        h.update(int(offset).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _read(fd: int, spans) -> list[tuple[int, bytes]]:
    return [(offset, os.pread(fd, n, offset)) for offset, n in spans]


@dataclass(kw_only=True, frozen=True)
class ShippedBase:
    name: str
    size: int
    key: str  # names the node's copy
    frame_sha: str
    frame: object  # ref: [(offset, bytes)] of everything but the windows' rows
    windows: tuple  # refs, one per window: [(offset, bytes)] of its stored rows
    digests: tuple  # sha256 of each window's piece

    @staticmethod
    def put(ray, reader) -> ShippedBase:
        """On the driver: the file of an open reader, a window at a time into the object store."""
        n = reader.header.n_chunk
        spans = sorted(s for w in range(n) for s in reader.stored_spans(w))
        gaps, at = [], 0
        for offset, length in spans + [(reader.file_size, 0)]:
            if offset > at:
                gaps.append((at, offset - at))
            at = max(at, offset + length)
        frame = _read(reader.fd, gaps)
        refs, digests = [], []
        for w in range(n):
            piece = _read(reader.fd, reader.stored_spans(w))
            refs.append(ray.put(piece))
            digests.append(_sha(piece))
        # The copy is named by every byte's digest: two files that share a frame (llama.cpp's
        # layout over the same tokens from two models) never share a node's copy.
        key = hashlib.sha256((_sha(frame) + "".join(digests)).encode()).hexdigest()
        return ShippedBase(
            name=os.path.basename(reader.path),
            size=reader.file_size,
            key=key,
            frame_sha=_sha(frame),
            frame=ray.put(frame),
            windows=tuple(refs),
            digests=tuple(digests),
        )

    def local_path(self) -> str:
        return os.path.join(tempfile.gettempdir(), "kldtool-shipped", self.key[:16], self.name)

    def fetch(self, needed: list[int]) -> str:
        """On a worker: this node's copy, holding at least windows ``needed``."""
        import ray

        path = self.local_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        listed = path + ".windows.json"
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            have = set(json.loads(open(listed).read())) if os.path.exists(listed) else None
            if have is None:  # a new copy: the frame first, in a file of the full size
                with open(path, "wb") as f:
                    f.truncate(self.size)
                self._write(path, ray.get(self.frame), self.frame_sha, "the file's frame")
                have = set()
            missing = sorted(set(needed) - have)
            for w in missing:
                self._write(path, ray.get(self.windows[w]), self.digests[w], f"window {w + 1}")
            if missing or not os.path.exists(listed):
                with open(listed + ".tmp", "w") as f:
                    json.dump(sorted(have | set(missing)), f)
                os.replace(listed + ".tmp", listed)  # listed only once written and synced
        return path

    @staticmethod
    def _write(path: str, piece, digest: str, what: str) -> None:
        if _sha(piece) != digest:
            raise OSError(f"{os.path.basename(path)}: {what} does not match the driver's digest")
        fd = os.open(path, os.O_WRONLY)
        try:
            for offset, data in piece:
                os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)


def visited(play, done: int, look: int) -> list[int]:
    """The windows a turn scores: visits ``done .. look-1`` of the sweep's one order."""
    a, b = play.span
    return [int(w) for w in np.asarray(play.order.arrange(list(range(a, b))))[done:look]]
