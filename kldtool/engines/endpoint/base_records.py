"""Top-K base records (codec/topk_records.py) from a server's answers: `base --endpoint`.

A server gives, per position, its top K log-probs and the target's; the record keeps those K ids
in the server's order, their codes, the target's code and the mass outside the K (1 - their sum,
to the float32 rounding of the server's numbers). The codes are made by the row encoder over a
row holding the known log-probs, the rest of the mass spread evenly over every other id (each
such entry at most the K-th's, as a top K says, so none of them is stored), so a reader
decodes them as it decodes any top-K file.
"""

from __future__ import annotations

import numpy as np

from kldtool.codec.rows import HEADER_SLOTS, Coding, encode_torch
from kldtool.codec.topk_records import HEAD, topk_width
from kldtool.errors import UsageError

BLOCK = 256  # positions encoded at once: a (BLOCK, vocabulary) float32 row block


def topk_records(
    ids: np.ndarray, lps: np.ndarray, target_lp: np.ndarray, targets, n_vocab: int, coding: Coding
) -> np.ndarray:
    """uint16 records (R, topk_width(K)) for the server's top-K ``ids`` / ``lps`` (R, K) and the
    targets' log-probs (R,)."""
    k = coding.keep
    if ids.shape[1] != k or (ids < 0).any():
        raise UsageError(f"--keep top-{k}: the server's answer names fewer than {k} token ids a position")
    out = np.zeros((len(ids), topk_width(k)), np.uint16)
    for a in range(0, len(ids), BLOCK):
        at = slice(a, a + BLOCK)
        out[at] = _block(ids[at], lps[at], target_lp[at], np.asarray(targets[at], np.int64), n_vocab, coding)
    return out


def _block(ids, lps, target_lp, targets, n_vocab: int, coding: Coding) -> np.ndarray:
    import torch

    r, k = ids.shape
    rest = np.maximum(1.0 - np.exp(lps).sum(axis=1), 0.0)  # the record's: the target's mass in it
    rows_i = np.arange(r)[:, None]
    outside = ~(ids == targets[:, None]).any(axis=1)  # a target beyond the K
    spread = np.maximum(rest - np.where(outside, np.exp(target_lp), 0.0), 0.0)
    n_other = n_vocab - k - outside
    fill = np.where(spread > 0, np.log(np.maximum(spread, 1e-300) / np.maximum(n_other, 1)), -np.inf)
    row = np.repeat(fill[:, None], n_vocab, axis=1)
    row[rows_i, ids] = lps
    row[np.arange(r), targets] = target_lp
    full, _ = encode_torch(torch.from_numpy(row.astype(np.float32)), coding.codec, coding.clamp)
    codes = full.numpy().view(np.uint16)[:, HEADER_SLOTS : HEADER_SLOTS + n_vocab]
    out = np.zeros((r, topk_width(k)), np.uint16)
    out[:, :HEADER_SLOTS] = full.numpy().view(np.uint16)[:, :HEADER_SLOTS]
    out[:, 4:6] = rest.astype(np.float32)[:, None].view(np.uint16)
    out[:, 6] = codes[np.arange(r), targets]
    out[:, HEAD : HEAD + 2 * k] = ids.astype(np.uint32).view(np.uint16).reshape(r, 2 * k)
    out[:, HEAD + 2 * k :] = codes[rows_i, ids]
    return out
