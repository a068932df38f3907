"""How the process's large buffers are allocated: page faults paid once a run, not once a row.

Every engine call allocates and frees buffers of rows x vocabulary (the model's logits and its
soft-cap's temporaries, decoded base rows, reducer inputs): tens of MB at 49k, a GiB and more
at 262k. A buffer that is its own mapping comes fresh from the kernel on every call, and each
first touch of a page is a fault: at 262,144 through transformers, 1,593 faults per scored
row under the mmap policy below, 515 under heap (benchmarks/vocab_scaling.py). glibc's own
threshold also moves: after such a free it rises, so later buffers come from the heap between
small long-lived objects, and RSS crept up with the number of chunks.

The policy, chosen once at start-up (``KLDTOOL_MALLOC`` overrides it; docs/usage.md):

- ``heap`` (default): no mmap'd buffers and no trimming. Freed buffers stay in the heap and the
  next block of the same size reuses them, so a run pays its page faults once, not once per
  row. The price is the peak: the heap fragments, by a different amount from run to run (at
  262,144: 3.34 or 4.27 GB where mmap peaks at 3.08; at SmolLM2 ~85 MiB more).
- ``mmap``: every buffer of 1 MiB and more is its own mapping, handed back when freed (the
  lower, flatter peak; a fault per page per use). The policy before heap.
- ``glibc``: glibc's own defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 1 << 20
NEVER_TRIM = 2**31 - 1  # mallopt takes an int
# Each policy sets every knob it relies on, so a benchmark can switch policies in one process.
SETTINGS = {
    "heap": ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM)),
    "mmap": ((M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, MMAP_BYTES), (M_TRIM_THRESHOLD, 128 << 10)),
}
POLICIES = ("heap", "mmap", "glibc")


def set_malloc_policy(policy: str | None = None) -> str | None:
    """Apply ``policy`` (else ``KLDTOOL_MALLOC``, else heap); the policy in force, or None
    where this is not glibc on Linux or the variable names no policy. ``glibc`` changes
    nothing: it is glibc's defaults only in a process no other policy was set in."""
    policy = policy or os.environ.get("KLDTOOL_MALLOC") or "heap"
    if policy not in POLICIES or not sys.platform.startswith("linux"):
        return None
    if policy == "glibc":
        return policy
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = all([libc.mallopt(knob, value) for knob, value in SETTINGS[policy]])
    except (OSError, AttributeError):
        return None
    return policy if ok else None


# From this many tokens a window, freed buffers go back to the system unless KLDTOOL_MALLOC says
# otherwise: within one long window the heap policy's holes add up, and its peak grew with the
# window's length (docs/benchmarks.md#long-windows-through-llamacpp), while a window's many
# blocks make the faults it saves a small share of the work.
LONG_WINDOW = 16_384


def note_long_window(n_ctx: int) -> None:
    """for_window, and a note on stderr where it switched (after the engine is made, so that a
    refused flag is the only line a failed command prints)."""
    if for_window(n_ctx):
        print(
            f"note: windows of {n_ctx} tokens: freed buffers go back to the system (KLDTOOL_MALLOC=mmap)",
            file=sys.stderr,
        )


def for_window(n_ctx: int) -> str | None:
    """Switch to the mmap policy for windows of LONG_WINDOW tokens or more where the user chose
    none; the policy switched to, or None where nothing changed."""
    if n_ctx < LONG_WINDOW or os.environ.get("KLDTOOL_MALLOC"):
        return None
    return set_malloc_policy("mmap")
