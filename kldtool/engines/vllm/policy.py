"""What the operator of a vLLM server lets kldtool's hook do, read from the server's environment.

The operator decides, the client asks: a served request only names a base file and an
exchange directory, and the hook reads and writes nothing outside the directories set here.

| variable | meaning |
| --- | --- |
| ``KLDTOOL_VLLM_HOOK=1`` | the hook is on (off when unset, ``0``, ``false`` or ``no``) |
| ``KLDTOOL_VLLM_BASE_ROOTS=dir1:dir2`` | the only directories base files are read from; required |
| ``KLDTOOL_VLLM_EXCHANGE_ROOT=dir`` | results are written only below it; required |
| ``KLDTOOL_VLLM_TOKEN`` | optional shared secret every request must carry |
| ``KLDTOOL_VLLM_MAX_REQUEST_BYTES=2G`` | the most host memory one request may hold in the hook (request_memory.py; default: an encode of 2,048 positions of the model's vocabulary) |

Paths are resolved (symlinks followed) before they are checked. A base file is then opened
once, without following a last symlink and without blocking, and checked again through the open
descriptor, which every later read of the request goes through (``open_base``). An exchange
directory is opened from the exchange root's descriptor, component by component, following no
symlink, and results are written only through that descriptor (confined.py). The offline
engine runs its own vLLM in the user's process: its hook reads the base file the user named and
writes nothing.
"""

from __future__ import annotations

import hmac
import os
import stat
from dataclasses import dataclass

from kldtool.engines.vllm.confined import ExchangeDir, NotConfined, open_regular
from kldtool.engines.vllm.request_memory import MAX_REQUEST_BYTES, parse_bytes
from kldtool.engines.vllm.wire import EXCHANGE_ROOT, TOKEN, is_text

HOOK = "KLDTOOL_VLLM_HOOK"
BASE_ROOTS = "KLDTOOL_VLLM_BASE_ROOTS"
SETTINGS = (HOOK, BASE_ROOTS, EXCHANGE_ROOT, TOKEN, MAX_REQUEST_BYTES)


class Refused(Exception):
    """A path or token the operator's settings do not allow: one line, never a file's bytes."""


def enabled(environ=os.environ) -> bool:
    return environ.get(HOOK, "").strip().lower() not in ("", "0", "false", "no")


def _inside(path: str, root: str) -> bool:
    return path == root or os.path.commonpath([path, root]) == root


@dataclass(kw_only=True, frozen=True)
class Policy:
    served: bool
    base_roots: tuple[str, ...] | None = None  # None: any base file (the offline engine's own process)
    exchange_root: str | None = None
    token: str | None = None
    problem: str | None = None  # a misconfiguration: every request is refused with this line
    max_request_bytes: int | None = None  # None: request_memory's default for the model

    @classmethod
    def offline(cls) -> "Policy":
        return cls(served=False)

    @classmethod
    def from_environment(cls, environ=os.environ) -> "Policy":
        problems = []
        roots = []
        for entry in environ.get(BASE_ROOTS, "").split(os.pathsep):
            if entry.strip():
                root = _root(entry.strip(), BASE_ROOTS, problems)
                if root:
                    roots.append(root)
        if not roots and not problems:
            problems.append(
                f"{BASE_ROOTS} is not set: the server's operator names the directories base files "
                f"may be read from (dir1{os.pathsep}dir2)"
            )
        exchange = environ.get(EXCHANGE_ROOT, "").strip() or None
        if exchange:
            exchange = _root(exchange, EXCHANGE_ROOT, problems)
        else:
            problems.append(
                f"{EXCHANGE_ROOT} is not set: the server's operator names the directory results are written below"
            )
        token = environ.get(TOKEN) or None
        bound = None
        if environ.get(MAX_REQUEST_BYTES, "").strip():
            try:
                bound = parse_bytes(environ[MAX_REQUEST_BYTES])
            except ValueError as e:
                problems.append(str(e))
        return cls(
            served=True,
            base_roots=tuple(roots),
            exchange_root=exchange,
            token=token,
            problem="kldtool's hook is off on this server: " + "; ".join(problems) if problems else None,
            max_request_bytes=bound,
        )

    def token_ok(self, given) -> bool:
        if self.token is None:
            return True
        # Text that cannot be a token (a lone surrogate, NUL, megabytes) is a wrong token, not an error.
        return is_text(given, max(len(self.token), 1024)) and hmac.compare_digest(given.encode(), self.token.encode())

    def exchange_dir(self, out: str) -> ExchangeDir:
        """The client's exchange directory, if it lies inside the exchange root, opened from the
        root's descriptor without following a symlink (confined.py): the caller keeps it open
        for the request's life and closes it."""
        if not self.served or self.exchange_root is None:
            raise Refused("no exchange directory is allowed here")
        if not is_text(out):
            raise Refused("the exchange directory is not a path")
        resolved = os.path.realpath(out)
        if not _inside(resolved, self.exchange_root):
            raise Refused(f"exchange directory {out} is outside {EXCHANGE_ROOT}")
        if not os.path.isdir(resolved):
            raise Refused(f"exchange directory {out} is not a directory")
        try:
            return ExchangeDir.below(self.exchange_root, resolved, out)
        except OSError as e:  # NotConfined included: swapped between the check and the walk
            raise Refused(str(e) if isinstance(e, NotConfined) else f"exchange directory {out}: {e.strerror}") from None

    def base_file(self, path: str) -> str:
        """The base file's resolved path, if it is a regular file the operator allows."""
        if not is_text(path):
            raise Refused("the base file is not a path")
        resolved = os.path.realpath(path)
        if not self._allowed(resolved):
            raise Refused(f"base file {path} is outside {BASE_ROOTS}")
        try:
            mode = os.stat(resolved).st_mode
        except OSError as e:
            raise Refused(f"base file {path}: {e.strerror}") from None
        if not stat.S_ISREG(mode):  # a FIFO or device would hang or flood the worker
            raise Refused(f"base file {path} is not a regular file")
        return resolved

    def open_base(self, path: str) -> tuple[int, os.stat_result]:
        """The allowed base file at ``path``, opened: (descriptor, its fstat). Checked by path
        (base_file), then opened without following a last symlink and without blocking, and
        checked again on the descriptor: a regular file whose real path is inside the roots.
        Whatever replaces the path afterwards (a symlink out of the roots, a FIFO, another
        file) is not what this descriptor reads."""
        resolved = self.base_file(path)
        try:
            fd = open_regular(resolved)
        except OSError as e:  # ELOOP: the path became a symlink after it was resolved
            raise Refused(f"base file {path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"base file {path} is not a regular file")
            real = opened_path(fd)
            if real is not None and not self._allowed(real):  # a directory above it was swapped
                raise Refused(f"base file {path} is outside {BASE_ROOTS}")
            return fd, st
        except BaseException:
            os.close(fd)
            raise

    def _allowed(self, resolved: str) -> bool:
        return self.base_roots is None or any(_inside(resolved, r) for r in self.base_roots)


FD_DIR = "/proc/self/fd"  # Linux: each open descriptor as a link to its file


def opened_path(fd: int) -> str | None:
    """The real path of the file open as ``fd``, where the system says (Linux), else None."""
    try:
        return os.readlink(f"{FD_DIR}/{fd}")
    except OSError:
        return None


def reopen_path(fd: int) -> str:
    """A path that opens the very file open as ``fd``, whatever its name now points at."""
    return f"{FD_DIR}/{fd}" if os.path.isdir(FD_DIR) else f"/dev/fd/{fd}"


def _root(entry: str, name: str, problems: list) -> str | None:
    if not os.path.isabs(entry):
        problems.append(f"{name}: {entry} is not an absolute path")
        return None
    resolved = os.path.realpath(entry)
    if not os.path.isdir(resolved):
        problems.append(f"{name}: {entry} is not a directory")
        return None
    return resolved
