"""The Triton reducer's records on the host: the kernel's table (triton_kernel.py) copied back
once, and the rows whose top-10 sets the lanes' candidates may have missed redone by topk over
their whole rows."""

from __future__ import annotations

import numpy as np

from kldtool.codec.rows import HEADER_SLOTS
from kldtool.reduce.records import PendingRecords, TokenRecords, to_records
from kldtool.reduce.rowmath import TOP_K, top_ids, top_overlaps
from kldtool.reduce.triton_kernel import COLUMNS, reduce_rows_triton

TOP_ROWS = 256  # rows whose int32 codes exist at once for topk


def triton_records(logits, base_rows, targets, clamped_at: float, defer: bool = False, **config):
    """The kernel's records, with one copy to the host (rows whose top-10 from the candidates
    may miss an entry go through topk over the whole row); ``defer``: as PendingRecords,
    everything queued on the device and nothing waited for; ``config``: the kernel's tile,
    num_warps and stages (benchmarks/gpu_reducer.py sweeps them)."""
    base_rows = base_rows.to(logits.device)
    table = reduce_rows_triton(logits, base_rows, targets, clamped_at, **config)
    finish = lambda: _on_host(table, logits, base_rows)  # noqa: E731
    return PendingRecords(finish) if defer else finish()


def _on_host(table, logits, base_rows) -> TokenRecords:
    import torch

    cols = dict(zip(COLUMNS, table.cpu().numpy()))
    unsure = np.nonzero(cols["unsure"])[0]
    for a in range(0, len(unsure), TOP_ROWS):
        idx = unsure[a : a + TOP_ROWS]
        rows = torch.as_tensor(idx, device=logits.device)
        for n, exact in zip(TOP_K, _exact_overlaps(logits[rows], base_rows[rows])):
            cols[f"top{n}"][idx] = exact.cpu().numpy()
    del cols["unsure"]
    return to_records(cols)


def _exact_overlaps(logits, rows) -> list:
    """The top-5/10 overlaps by topk over whole rows (rowmath.top_ids)."""
    import torch

    codes = rows[:, HEADER_SLOTS : HEADER_SLOTS + logits.shape[1]].to(torch.int32) & 0xFFFF
    # Codes rank as the values they decode to, unless the row's scale is 0 (all equal).
    codes *= rows[:, :HEADER_SLOTS].contiguous().view(torch.float32)[:, :1] > 0
    k = max(TOP_K)
    return top_overlaps(top_ids(logits, k), top_ids(codes, k))
