"""Keep the resident set flat over long runs.

Each pass allocates and frees buffers of tens of MB (decoded base rows, reducer temporaries).
glibc raises its mmap threshold after such frees, so later buffers come from the heap and
fragment it, and RSS creeps up with the number of chunks. Pinning the threshold makes every
large buffer an mmap that goes back to the system when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 1 << 20


def pin_mmap_threshold() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
