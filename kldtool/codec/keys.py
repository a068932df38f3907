"""Sort keys for top-k sets: the same sets whatever order topk gives equal values, which bf16
logits and uint16 codes often have. Shared by the top-K encoder and the reducers."""

from __future__ import annotations


def order_keys(x):
    """int64 keys of (rows, n) float or integer values, in the values' order, ties broken
    towards the lower index."""
    import torch

    if x.is_floating_point():
        bits = (x.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 -> +0.0
        ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    else:
        ordered = x.to(torch.int64)
    width = x.shape[1]
    return ordered * (1 << 32) + (width - 1 - torch.arange(width, device=x.device))
