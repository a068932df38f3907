"""``sweep --ray --ship-base``: the base file put into Ray's object store once, by the driver,
for clusters whose nodes share no filesystem.

The driver puts the file in pieces (a piece at a time, so it never holds the whole file in
memory) with a digest of its bytes. The first turn on each node copies the pieces into the
node's temporary directory, under a lock and by an atomic rename, and every later turn there
opens that copy. A node fetches the whole file, once: a turn's windows are spread over it in the
sweep's random order.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from dataclasses import dataclass

PIECE = 64 << 20


@dataclass(frozen=True)
class ShippedBase:
    name: str
    size: int
    digest: str  # sha256 of the file's bytes
    pieces: tuple  # Ray object refs, in file order

    @staticmethod
    def put(ray, path: str) -> ShippedBase:
        h, pieces, size = hashlib.sha256(), [], 0
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(PIECE), b""):
                h.update(block)
                size += len(block)
                pieces.append(ray.put(block))
        return ShippedBase(os.path.basename(path), size, h.hexdigest(), tuple(pieces))

    def local_path(self) -> str:
        return os.path.join(tempfile.gettempdir(), "kldtool-shipped", self.digest[:16], self.name)

    def fetch(self) -> str:
        """This node's copy of the file (on a worker), made by the first turn that needs it."""
        import ray

        path = self.local_path()
        if os.path.exists(path) and os.path.getsize(path) == self.size:
            return path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path) and os.path.getsize(path) == self.size:
                return path  # another turn on this node fetched it while this one waited
            h = hashlib.sha256()
            with open(path + ".part", "wb") as f:
                for ref in self.pieces:
                    block = ray.get(ref)
                    h.update(block)
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
            if h.hexdigest() != self.digest:
                os.unlink(path + ".part")
                raise OSError(f"{self.name}: the shipped pieces do not add up to the driver's file")
            os.replace(path + ".part", path)
        return path
