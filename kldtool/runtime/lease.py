"""A lease on a file beside what it guards: one holder at a time, across processes and nodes
that share a directory, including file systems where ``flock`` is node-local (NFSv3) or
missing (``ENOSYS``).

The lease is a small JSON file created with ``O_CREAT|O_EXCL`` (atomic on local file systems
and on NFSv3 and later): who holds it (an id, its host and boot, its process) and a heartbeat
count that a thread of the holder advances every ``stale_after / 4`` seconds. A waiter takes
the lease over when its holder is gone: at once when the holder ran on this machine and its
process no longer exists, else once the heartbeat has not moved for ``stale_after`` seconds of
the waiter's own clock (no two nodes' clocks are compared). A takeover moves the lease aside
under a name of the waiter's own and checks that what it moved is what it saw go stale: a
lease renewed in between is put back.

A holder that stalls longer than ``stale_after`` (a suspended process) may have lost its lease;
its heartbeat notices and ``lost`` says so.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time

STALE_AFTER_S = float(os.environ.get("KLDTOOL_LEASE_STALE_S", "60"))
POLL_S = 0.2


class LeaseTimeout(TimeoutError):
    """The lease stayed held by a live holder for longer than the waiter would wait."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class Lease:
    def __init__(self, path: str, stale_after: float = STALE_AFTER_S, driver: str | None = None):
        self.path, self.stale_after = path, stale_after
        self.me = {
            "holder": secrets.token_hex(8),
            "driver": driver,
            "host": socket.gethostname(),
            "boot": _boot_id(),
            "pid": os.getpid(),
        }
        self.beat = 0
        self.lost = False
        self.took_over: dict | None = None  # the stale lease this one replaced, if any
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- taking it -----------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> "Lease":
        t0 = time.monotonic()
        seen, since = None, time.monotonic()
        while True:
            if self._create():
                self._thread = threading.Thread(target=self._heartbeat, name="kldtool-lease", daemon=True)
                self._thread.start()
                return self
            now = time.monotonic()
            current = self._read()
            if current != seen:
                seen, since = current, now
            if current is not None and (self._gone(current) or now - since >= self.stale_after):
                self._take_over(current)
                continue
            if timeout is not None and now - t0 >= timeout:
                raise LeaseTimeout(f"{self.path}: held by {_who(current)} for more than {timeout:g} s")
            time.sleep(POLL_S)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, self._content().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _content(self) -> str:
        return json.dumps({**self.me, "beat": self.beat})

    def _read(self) -> dict | str | None:
        """The lease's content: a dict, its raw text where it is not one (a holder between
        creating and writing it), or None where there is no lease."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                text = f.read(4096)
        except FileNotFoundError:
            return None
        except OSError:
            return ""
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if isinstance(value, dict) else text

    def _gone(self, current) -> bool:
        """Whether a holder on this very machine (same host and boot) has no process any more."""
        if not isinstance(current, dict) or current.get("host") != self.me["host"] or not self.me["boot"]:
            return False
        pid = current.get("pid")
        return current.get("boot") == self.me["boot"] and isinstance(pid, int) and pid > 0 and not _alive(pid)

    def _take_over(self, stale) -> None:
        aside = f"{self.path}.stale-{self.me['holder']}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # released, or taken over by another waiter: try again
        moved = self._read_at(aside)
        if moved == stale:
            self.took_over = stale if isinstance(stale, dict) else {"raw": stale}
        else:  # renewed between our read and the rename: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass  # a third party took it meanwhile; the renewed holder's heartbeat will notice
        os.unlink(aside)

    def _read_at(self, path: str):
        keep, self.path = self.path, path
        try:
            return self._read()
        finally:
            self.path = keep

    # --- holding it ----------------------------------------------------------------------

    def _heartbeat(self) -> None:
        while not self._stop.wait(max(self.stale_after / 4, 0.05)):
            current = self._read()
            if not isinstance(current, dict) or current.get("holder") != self.me["holder"]:
                self.lost = True
                return
            self.beat += 1
            tmp = f"{self.path}.beat-{self.me['holder']}"
            try:
                with open(tmp, "w") as f:
                    f.write(self._content())
                os.replace(tmp, self.path)
            except OSError:
                continue  # the next beat tries again; a waiter sees no change for a while

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        current = self._read()
        if isinstance(current, dict) and current.get("holder") == self.me["holder"]:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _who(current) -> str:
    if isinstance(current, dict):
        return f"process {current.get('pid')} on {current.get('host')}"
    return "a holder that has not written its name"
