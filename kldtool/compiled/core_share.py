"""Whether a compiled loop may spread one call over every core, or the calling thread is one
lane of several that each keep a core busy (engines/llamacpp/lanes.py: llama.cpp contexts decoding
different chunks side by side).

A lane's reductions run on its own thread: numba's parallel loops, called from two threads at
once, would fight over one worker pool (numba's default pool aborts the process then), and on
a machine whose cores the lanes already fill they could only add contention.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

_local = threading.local()


def spread() -> bool:
    """True unless the calling thread is inside :func:`one_core`."""
    return not getattr(_local, "one_core", False)


@contextmanager
def _mode(alone: bool):
    before = getattr(_local, "one_core", False)
    _local.one_core = alone
    try:
        yield
    finally:
        _local.one_core = before


def one_core():
    """Compiled loops called in this block run on the calling thread alone."""
    return _mode(True)


def all_cores():
    """Compiled loops called in this block may spread again (the one lane still running)."""
    return _mode(False)
