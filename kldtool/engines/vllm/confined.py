"""Every file operation of the served hook: through descriptors it checked, never a path again.

A served request names its exchange directory; a client that holds the operator's token can
still race the hook: plant a symlink where the hook will write, or swap the checked directory
for a symlink while its request is scored. So the directory is opened at admission one
component at a time from the exchange root's descriptor, none of them followed if it is a
symlink, and that descriptor is kept for the request's life. A result is written to a new file
created under it (``O_EXCL|O_NOFOLLOW``, a name nobody can guess) and renamed into place on the
same descriptor: whatever happens to the directory's path afterwards, the result lands in the
directory that was checked, or nowhere.

A base file is opened without following a last symlink and without blocking (policy.py checks
its real path through the open descriptor); every later read goes through that descriptor.

tests/test_package_shape.py holds the hook's other modules to this one: none of them opens,
renames or removes a file by its path.
"""

from __future__ import annotations

import os
import secrets

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class NotConfined(OSError):
    """A path that left, or never was, the directory it had to be in: one line, no bytes of it."""


def open_regular(path: str) -> int:
    """A descriptor of the file at ``path``, opened read-only, without following a last symlink
    (ELOOP) and without blocking on a FIFO; the caller checks what it is through it."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)


class ExchangeDir:
    """A served request's exchange directory, held open from admission to its last result."""

    def __init__(self, fd: int, shown: str):
        self.fd, self.shown = fd, shown

    @classmethod
    def below(cls, root: str, resolved: str, shown: str) -> "ExchangeDir":
        """``resolved`` (a real path inside the real path ``root``) opened component by component
        from ``root``, following no symlink: a directory swapped for one after ``resolved`` was
        computed fails here, never leads elsewhere. ``shown``: the client's path, for messages."""
        rel = os.path.relpath(resolved, root)
        parts = [] if rel == os.curdir else rel.split(os.sep)
        if os.pardir in parts or os.path.isabs(rel):
            raise NotConfined(f"exchange directory {shown} is outside the exchange root")
        flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
        fd = os.open(root, flags)
        try:
            for name in parts:
                try:
                    nxt = os.open(name, flags, dir_fd=fd)
                except OSError as e:  # ELOOP, ENOTDIR: a component is (now) a symlink or a file
                    raise NotConfined(f"exchange directory {shown}: {name} is not a directory ({e.strerror})") from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, shown)

    def publish(self, name: str, payload: bytes) -> None:
        """``payload`` as the file ``name`` in this directory, renamed into place only once
        whole (the client may look at any moment); a link planted at ``name`` is replaced, its
        target untouched."""
        tmp = f".{name}.{secrets.token_hex(16)}.partial"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666, dir_fd=self.fd)
        try:
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
