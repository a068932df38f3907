"""Windows in batches: what one engine call takes, and where a batch ends (resume points)."""

from __future__ import annotations

from typing import Iterator


def groups(windows: list, size: int) -> Iterator[list]:
    """Consecutive windows of one shape, at most ``size`` at a time: what one engine call takes."""
    group: list = []
    for w in windows:
        if group and (len(group) == size or w.shape != group[0].shape):
            yield group
            group = []
        group.append(w)
    if group:
        yield group


def whole_batches(windows: list, size: int, k: int) -> int:
    """The largest batch boundary at or below ``k`` windows: where a resumed run may continue
    and still evaluate the same batches (so it prints the same digits)."""
    return last_end(batch_ends(windows, size), k)


def batch_ends(windows: list, size: int, cuts: list[int] = ()) -> list[int]:
    """Every batch boundary, as counts of windows, ascending (the last is ``len(windows)``), when
    no batch may run across a cut (the looks of an early-stopping rule)."""
    ends, start = [], 0
    for cut in sorted({c for c in cuts if 0 < c < len(windows)} | {len(windows)}):
        for g in groups(windows[start:cut], size):
            ends.append((ends[-1] if ends else 0) + len(g))
        start = cut
    return ends


def last_end(ends: list[int], k: int) -> int:
    """The largest boundary in ``ends`` at or below ``k`` (0 if none)."""
    return max((e for e in ends if e <= k), default=0)
