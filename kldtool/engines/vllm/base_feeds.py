"""The base files a worker's hook has open, each read only through the descriptor its checks
opened.

A compare request names a base file; the operator's policy resolves, opens and checks it once
(``Policy.open_base``), and the request's rows come from that descriptor to the end: the path
is never opened again, so a file swapped for a symlink, a FIFO or another file after the check
is not read, and a file changed in place fails the requests reading it. Files of one identity
(device, inode, size, mtime) share one prefetching feed; past a few, the least recently used
that no running request reads are closed.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from kldtool.engines.vllm.policy import Policy, Refused, reopen_path
from kldtool.engines.vllm.wire import one_line

MAX_OPEN_BASES = 4  # base files a worker keeps open for requests that come back to them


class BaseFeeds:
    def __init__(self, policy: Policy, device: str):
        self.policy, self.device = policy, device
        self._open: OrderedDict = OrderedDict()  # identity -> (ChunkFeed, descriptor)

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, path: str, reading: set) -> tuple:
        """The identity of the feed of the base file ``path`` names, opened through the
        policy's checks; ``reading``: the identities running requests read (kept open)."""
        from kldtool.logitsfile import container, open_base_file, raw
        from kldtool.logitsfile.prefetch import ChunkFeed

        fd, st = self.policy.open_base(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._open:
            os.close(fd)
            self._open.move_to_end(key)
            return key
        try:
            if os.pread(fd, 8, 0) not in (container.MAGIC, raw.MAGIC):  # no error may quote another file's bytes
                raise Refused(f"{path} is not a kldtool or llama.cpp base file")
            try:
                reader = open_base_file(reopen_path(fd))  # the file this descriptor holds, not the path
            except Exception as e:  # its reason, naming the path the client gave
                raise Refused(one_line(f"{type(e).__name__}: {e}").replace(reopen_path(fd), path)) from None
            try:
                feed = ChunkFeed(reader, self.device)
            except BaseException:
                reader.close()
                raise
        except BaseException:
            os.close(fd)
            raise
        self._open[key] = (feed, fd)
        self._trim(reading | {key})
        return key

    def get(self, key: tuple, path: str):
        """The feed of ``key``, as long as its file is the one that was checked."""
        entry = self._open.get(key)
        if entry is None:
            raise Refused(f"{path}: its base file was closed while the request ran")
        feed, fd = entry
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != key[2:]:
            raise Refused(f"{path} changed while the request ran")
        return feed

    def _trim(self, keep: set) -> None:
        for key in [k for k in self._open if k not in keep]:
            if len(self._open) <= MAX_OPEN_BASES:
                break
            feed, fd = self._open.pop(key)
            feed.close()
            feed.reader.close()
            os.close(fd)
