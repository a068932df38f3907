"""Per-token records, the only thing a reducer hands back: a few host numpy columns per scored
token, named and typed once (``FIELDS``) for every backend, accumulator and per-token file.
Backends hand their columns by name (``to_records``); a statistic is added here, computed in
each backend under the same name, and summed in ``stats/accumulator.py``'s ``SUM_OF``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FIELDS = {
    "nll": np.float32,
    "nll_base": np.float32,
    "kld": np.float64,
    "dp": np.float32,
    "same_top": np.bool_,
    "rkld": np.float64,
    "jsd": np.float64,
    "top5": np.uint8,
    "top10": np.uint8,
    "ptop_base": np.float32,
    "ptop_q": np.float32,
    "kld_tail": np.float64,
    "top1_q": np.int32,
    "top1_base": np.int32,
    "tv": np.float64,
    "tv_hi": np.float64,
    "p_out": np.float32,
}
# What a reducer of whole rows leaves out, as known from its other columns (to_records fills them).
FILLED = ("kld_tail", "tv_hi", "p_out")
WHOLE_ROW = tuple(f for f in FIELDS if f not in FILLED)  # the columns a whole-row reducer computes


@dataclass(kw_only=True)
class TokenRecords:
    """Per scored token, host numpy arrays of equal length (dtypes in ``FIELDS``)."""

    nll: np.ndarray  # compared model
    nll_base: np.ndarray  # decoded from the base row
    kld: np.ndarray  # KL(base‖q); llama.cpp keeps the double for its sums, float for percentiles
    dp: np.ndarray  # p_q(target) - p_base(target)
    same_top: np.ndarray  # argmax agreement
    rkld: np.ndarray  # KL(q‖base)
    jsd: np.ndarray  # Jensen–Shannon divergence (nats)
    top5: np.ndarray  # |top5(q) ∩ top5(base)|
    top10: np.ndarray  # |top10(q) ∩ top10(base)|
    ptop_base: np.ndarray  # the base's largest probability
    ptop_q: np.ndarray  # the compared model's largest probability (its confidence)
    kld_tail: np.ndarray  # top-K base rows: estimate of the KLD the unstored tail hides (else 0)
    top1_q: np.ndarray  # the compared model's most probable token id (the lowest id on a tie)
    top1_base: np.ndarray  # the base's
    tv: np.ndarray  # total variation ½ Σ |p - q|; where rows are known in part, its least value
    tv_hi: np.ndarray  # its largest value (= tv where both rows are whole)
    p_out: np.ndarray  # the base's mass outside the entries known on both sides (0 for whole rows)

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


if tuple(TokenRecords.__dataclass_fields__) != tuple(FIELDS):  # a field added to one and not the other
    raise TypeError("TokenRecords must hold FIELDS, in FIELDS' order")


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


def settled(records):
    """``records`` on the host (a pending result waited for)."""
    return records.result() if isinstance(records, PendingRecords) else records
