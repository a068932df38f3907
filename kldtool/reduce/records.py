"""Per-token records, the only thing a reducer hands back: a few host numpy columns per scored
token, one per statistic of statistics.py, for every backend, accumulator and per-token file.
Backends hand their columns by name (``to_records``)."""

from __future__ import annotations

from dataclasses import make_dataclass

import numpy as np

from kldtool.reduce.statistics import STATISTICS

FIELDS = {s.name: s.dtype for s in STATISTICS}
# What a reducer of whole rows leaves out, as known from its other columns (to_records fills them).
FILLED = tuple(s.name for s in STATISTICS if s.filled)
WHOLE_ROW = tuple(f for f in FIELDS if f not in FILLED)  # the columns a whole-row reducer computes


class _Columns:
    """Per scored token, host numpy arrays of equal length (dtypes in ``FIELDS``; what each
    holds: statistics.py)."""

    def __len__(self) -> int:
        return len(self.nll)

    @classmethod
    def empty(cls, n: int) -> "TokenRecords":
        return cls(**{f: np.zeros(n, dt) for f, dt in FIELDS.items()})

    @classmethod
    def from_columns(cls, cols) -> "TokenRecords":
        return cls(**{f: np.asarray(cols[f], dt) for f, dt in FIELDS.items()})

    @classmethod
    def concat(cls, parts: list["TokenRecords"]) -> "TokenRecords":
        if len(parts) == 1:
            return parts[0]
        return cls(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS})


TokenRecords = make_dataclass("TokenRecords", [(f, np.ndarray) for f in FIELDS], bases=(_Columns,), kw_only=True)
TokenRecords.__module__ = __name__


def to_records(cols: dict) -> TokenRecords:
    """Records from a backend's columns by name. Where both rows are whole a backend leaves
    out what is then known: ``kld_tail`` and ``p_out`` (0) and ``tv_hi`` (= ``tv``)."""
    n = len(cols["nll"])
    given = {"kld_tail": np.zeros(n), "p_out": np.zeros(n), **cols}
    given.setdefault("tv_hi", given["tv"])
    unknown = set(given) - set(FIELDS)
    if unknown:
        raise KeyError(f"not a record field: {sorted(unknown)}")
    return TokenRecords.from_columns(given)


class PendingRecords:
    """Records whose computation is queued on a device: ``result()`` waits for it and brings
    them to the host. An engine takes them after queueing its next block's work, so the device
    computes that block while the host finishes this one."""

    def __init__(self, finish):
        self._finish = finish

    def result(self) -> TokenRecords:
        return self._finish()


def on_host(records):
    """``records`` on the host (a pending result waited for)."""
    return records.result() if isinstance(records, PendingRecords) else records
