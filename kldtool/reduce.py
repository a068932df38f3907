"""The reducer: compared logits + base rows -> a handful of numbers per scored token.

Runs wherever the logits are (CPU or CUDA) with no Python loop over tokens or vocabulary;
only the per-token records leave the device. The arithmetic follows llama-perplexity's
``log_softmax`` (FORMAT.md §5): float32 terms, float64 sums, KLD over the base entries whose
decoded log-prob exceeds -16, base probabilities not renormalized, first-index argmax.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from kldtool.codec import decode_torch, normalizer_torch

KLD_FLOOR = -16.0
# Rows reduced at once: bounds the (block, V) float32 temporaries (~6 of them).
ROW_BLOCK = 32


@dataclass
class TokenRecords:
    """Per scored token, host numpy arrays of equal length."""

    nll: np.ndarray  # float32, compared model
    nll_base: np.ndarray  # float32, decoded from the base row
    kld: np.ndarray  # float64 (llama.cpp keeps the double for its sums, float for percentiles)
    dp: np.ndarray  # float32, p_q(target) - p_base(target)
    same_top: np.ndarray  # bool, argmax agreement

    def __len__(self) -> int:
        return len(self.nll)

    @classmethod
    def concat(cls, parts: list["TokenRecords"]) -> "TokenRecords":
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))


def reduce_rows(logits, base_rows, targets) -> TokenRecords:
    """Reduce compared logits (R, V) against int16 base rows (R, NV) for target ids (R,)."""
    import torch

    base_rows = base_rows.to(logits.device)
    if use_triton(logits.device):
        from kldtool.reduce_triton import reduce_rows_triton

        nll, nll_base, kld, dp, same = reduce_rows_triton(logits, base_rows, targets, KLD_FLOOR).cpu().numpy()
        f32 = np.float32
        return TokenRecords(nll.astype(f32), nll_base.astype(f32), kld, dp.astype(f32), same.astype(bool))
    n_vocab = logits.shape[1]
    targets = torch.as_tensor(targets, dtype=torch.int64, device=logits.device)
    out = [_reduce_block(logits[a:a + ROW_BLOCK], base_rows[a:a + ROW_BLOCK], targets[a:a + ROW_BLOCK], n_vocab)
           for a in range(0, logits.shape[0], ROW_BLOCK)]
    return TokenRecords(*(torch.cat([o[k] for o in out]).cpu().numpy() for k in range(5)))


def use_triton(device) -> bool:
    """The one-pass Triton kernel on CUDA when Triton is installed; ``KLDTOOL_REDUCER=torch``
    or ``=triton`` forces a choice (triton on CPU needs ``TRITON_INTERPRET=1``: tests only)."""
    choice = os.environ.get("KLDTOOL_REDUCER", "auto")
    if choice in ("torch", "triton"):
        return choice == "triton"
    if getattr(device, "type", "cpu") != "cuda":
        return False
    return _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _reduce_block(logits, rows, targets, n_vocab):
    import torch

    logits = logits.to(torch.float32)
    mx, imax, lse = normalizer_torch(logits)
    big_m = mx + lse
    tcol = targets[:, None]
    nll = big_m - logits.gather(1, tcol)[:, 0]
    b = decode_torch(rows, n_vocab)
    nll_base = -b.gather(1, tcol)[:, 0]
    imax_base = b.argmax(dim=1)
    terms = torch.exp(b) * ((b - logits) + big_m[:, None])
    kld = torch.where(b > KLD_FLOOR, terms, torch.zeros_like(terms)).sum(dim=1, dtype=torch.float64)
    dp = torch.exp(-nll) - torch.exp(-nll_base)
    return nll, nll_base, kld, dp, imax == imax_base
