"""Sort keys for top-k sets: the same sets whatever order topk gives equal values, which bf16
logits and uint16 codes often have. Shared by the top-K encoder and the reducers."""

from __future__ import annotations


def order_keys(x):
    """int64 keys of (rows, n) float or integer values, in the values' order, ties broken
    towards the lower index."""
    import torch

    width = x.shape[1]
    return ordered_bits(x) * (1 << 32) + (width - 1 - torch.arange(width, device=x.device))


def ordered_bits(x):
    """int64 values in the order of ``x``'s (floats: their float32 bits made monotonic, -0.0
    equal to +0.0; integers: themselves)."""
    import torch

    if not x.is_floating_point():
        return x.to(torch.int64)
    bits = (x.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 -> +0.0
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
