"""Compact base rows (``base --keep K``): per scored position the K most probable entries and
the exact probability mass of all the others, ~V / 3K times smaller than a full row.

A record is K-independent of the vocabulary size, in uint16 slots::

    0  float32 scale | 2 float32 min_log_prob    the full row's code parameters (rows.py)
    4  float32 rest                              Σ p over the entries not kept (float64 sum)
    6  uint16 target code | 7 pad
    8  uint32 ids[K]                             most probable first, equal codes lowest id first
    8 + 2K  uint16 codes[K]                      the full row's codes of those ids

Codes are the very codes a full row of the same logits holds, so a top-K file is a subset of
the full file, not a second rounding. The target's code is stored whatever its rank, so NLL,
PPL and Δp stay exact.
"""

from __future__ import annotations

from kldtool.codec.keys import order_keys
from kldtool.codec.rows import HEADER_SLOTS, Coding, decode_torch, encode_torch
from kldtool.errors import UsageError

HEAD = 8
REST = 4  # the float32 rest mass's first uint16 slot (the layout above)
MIN_KEEP = 10  # top-10 agreement needs the base's ten first


def topk_width(k: int) -> int:
    return HEAD + 3 * k


def encode_topk_torch(logits, targets, coding: Coding):
    """(int16 records (R, topk_width(coding.keep)) on the logits' device, M = max + lse per row)."""
    import torch

    logits = logits.to(torch.float32)
    full, norm = encode_torch(logits, coding.codec, coding.clamp)
    codes = full[:, HEADER_SLOTS : HEADER_SLOTS + logits.shape[1]]
    ids = _top_ids(codes, coding.keep)
    p = torch.exp((logits - norm[:, None]).to(torch.float64))
    return _records(full, codes, ids, p.scatter(1, ids, 0.0).sum(dim=1), targets), norm


def topk_of_rows(rows, targets, k: int, n_vocab: int):
    """Top-``k`` records of full int16 rows (a stored full base file's): the same ids, codes and
    row parameters as the records the run itself would have written. The rest mass is summed
    over the stored codes not kept, as the full file's reader sees them (clamped entries count
    0: their log-probs are not stored), so it can fall below the run's own by that mass."""
    import torch

    codes = rows[:, HEADER_SLOTS : HEADER_SLOTS + n_vocab]
    ids = _top_ids(codes, k)
    p = torch.exp(decode_torch(rows, n_vocab).to(torch.float64)).masked_fill(codes == 0, 0.0)
    return _records(rows, codes, ids, p.scatter(1, ids, 0.0).sum(dim=1), targets)


def _top_ids(codes, k: int):
    import torch

    # ranked by code (what a reader of the full row sees), ties to the lower id
    return order_keys(codes.to(torch.int32) & 0xFFFF).topk(k, dim=1).indices


def _records(full, codes, ids, rest, targets):
    import torch

    t = torch.as_tensor(targets, dtype=torch.int64, device=codes.device)[:, None]
    head = torch.cat(
        [
            full[:, :HEADER_SLOTS],
            rest.to(torch.float32)[:, None].contiguous().view(torch.int16),
            codes.gather(1, t),
            torch.zeros((len(codes), 1), dtype=torch.int16, device=codes.device),
        ],
        dim=1,
    )
    return torch.cat([head, ids.to(torch.int32).contiguous().view(torch.int16), codes.gather(1, ids)], dim=1)


def split_records(rows, k: int):
    """(scale, min_log_prob, rest, target code, ids int64, codes int32) of int16 records."""
    import torch

    f32 = rows[:, :6].contiguous().view(torch.float32)
    ids = rows[:, HEAD : HEAD + 2 * k].contiguous().view(torch.int32).to(torch.int64)
    codes = rows[:, HEAD + 2 * k : HEAD + 3 * k].to(torch.int32) & 0xFFFF
    return f32[:, 0], f32[:, 1], f32[:, 2], rows[:, 6].to(torch.int32) & 0xFFFF, ids, codes


def rest_np(records):
    """The float32 rest mass of each uint16 (or int16) top-K record, on the host."""
    import numpy as np

    return np.ascontiguousarray(records[:, REST : REST + 2]).view(np.float32)[:, 0]


def keep_of(spec: str | None) -> int | None:
    """``--keep top-K`` (or ``K``) -> K; None keeps the full rows."""
    if spec is None or spec in ("all", "full"):
        return None
    text = spec[4:] if spec.startswith("top-") else spec
    if not text.isdigit() or int(text) < MIN_KEEP:
        raise UsageError(f"--keep {spec}: expected top-K with K >= {MIN_KEEP} (e.g. top-256), or all")
    return int(text)
