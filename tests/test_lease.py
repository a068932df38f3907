"""The sweep's per-quant lease (kldtool/runtime/lease.py, issue 78): one holder at a time across
processes, taken over at once from a holder on this machine whose process is gone, after its
stated staleness from a holder elsewhere whose heartbeat stopped, never from a live one, and
all of it where ``flock`` is not supported (ENOSYS, as on some network file systems)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kldtool.runtime.lease import Lease, LeaseTimeout

pytestmark = pytest.mark.quick

HOLD = """
import sys, time
from kldtool.runtime.lease import Lease
lease = Lease(sys.argv[1], stale_after=float(sys.argv[2])).acquire()
print("held", flush=True)
time.sleep(float(sys.argv[3]))
lease.release()
"""


def _holder(path, stale_after: float, hold_s: float) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(stale_after), str(hold_s)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.fixture(autouse=True)
def no_flock(monkeypatch):
    """Every test here runs where flock raises ENOSYS: the lease must not need it."""

    def refuse(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", refuse)


def test_one_holder_at_a_time_and_a_live_one_is_waited_for(tmp_path):
    path = tmp_path / "q.lease"
    holder = _holder(path, 0.4, 2.0)  # heartbeats every 0.1 s: never stale while it lives
    t = time.monotonic()
    with pytest.raises(LeaseTimeout, match="held by process"):
        Lease(str(path), stale_after=0.4).acquire(timeout=1.0)
    with Lease(str(path), stale_after=0.4) as mine:
        waited = time.monotonic() - t
        assert mine.took_over is None and json.loads(path.read_text())["holder"] == mine.me["holder"]
    assert holder.wait(10) == 0 and waited >= 1.5  # it waited for the release, took nothing over
    assert not path.exists()


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path):
    path = tmp_path / "q.lease"
    holder = _holder(path, 60.0, 600.0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    t = time.monotonic()
    lease = Lease(str(path), stale_after=60.0).acquire(timeout=5.0)
    try:
        assert time.monotonic() - t < 5.0 and lease.took_over["pid"] == holder.pid
    finally:
        lease.release()


def test_a_silent_holder_elsewhere_is_taken_over_once_stale(tmp_path):
    """A lease of another node (another host name) whose heartbeat does not move is taken over
    after stale_after seconds of the waiter's own clock, and not before."""
    path = tmp_path / "q.lease"
    path.write_text(json.dumps({"holder": "f" * 16, "host": "other-node", "boot": "x", "pid": 1, "beat": 7}))
    t = time.monotonic()
    lease = Lease(str(path), stale_after=1.0).acquire(timeout=10.0)
    took = time.monotonic() - t
    lease.release()
    assert 1.0 <= took < 3.0 and lease.took_over["host"] == "other-node", took


def test_a_half_written_lease_is_stale_too(tmp_path):
    path = tmp_path / "q.lease"
    path.write_text('{"holder": "ab')  # its holder died between creating and writing it
    lease = Lease(str(path), stale_after=0.5).acquire(timeout=5.0)
    lease.release()
    assert lease.took_over == {"raw": '{"holder": "ab'}
