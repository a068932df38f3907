"""The base phase's device-side step: one window's logits -> stored rows (full or top-K) and
the NLL of each target; and score mode's NLL by the same arithmetic."""

from __future__ import annotations

import importlib.util

import numpy as np

from kldtool.codec.rows import DEFAULT_CLAMP, LLAMA_ROUNDING, Coding, encode_torch, normalizer_torch, rows_to_numpy
from kldtool.codec.topk_records import encode_topk_torch

# Float32 logits encoded at once. The encoder's temporaries are a few times its input, so a
# block of 1,023 rows of a 262,144-token vocabulary (1 GiB) would need ~5 GiB more beside the
# model; rows are independent, so slices of this size give the same bytes.
ENCODE_BYTES = 256 << 20


def encode_base_rows(logits, targets, coding: Coding) -> tuple[np.ndarray, np.ndarray]:
    """Base mode for one window on any device: (uint16 host rows, float32 NLL of each target),
    the NLL as llama.cpp's phase 1 computes it, ``(max + lse) - logit[target]``. With
    ``coding.keep`` the rows are top-K records (codec/topk_records.py), made on the device."""
    parts = list(encode_base_slices(logits, targets, coding))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def encode_base_slices(logits, targets, coding: Coding):
    """:func:`encode_base_rows` slice by slice of ENCODE_BYTES of logits, for a caller that
    takes rows as they come (the base writer): no block's rows are ever joined in one array."""
    import torch

    logits = torch.as_tensor(logits)
    step = max(1, ENCODE_BYTES // (4 * logits.shape[-1]))
    for a in range(0, len(logits), step):
        yield _encode(logits[a : a + step], targets[a : a + step], coding)


def _encode(logits, targets, coding: Coding) -> tuple[np.ndarray, np.ndarray]:
    # The encoders take float32 themselves (the Triton one reads the model's dtype directly).
    if coding.keep:
        rows, norm = encode_topk_torch(logits, targets, coding)
    else:
        rows, norm = encode_device(logits, coding.codec, coding.clamp)
    return rows_to_numpy(rows), _nll(logits, norm, targets)


def encode_device(logits, codec: str = LLAMA_ROUNDING, clamp: float = DEFAULT_CLAMP):
    """encode_torch's rows, made by the Triton kernels on a CUDA device (rows_triton.py:
    no vocabulary-sized temporaries), by torch elsewhere."""
    if logits.is_cuda and importlib.util.find_spec("triton") is not None:
        from kldtool.codec.rows_triton import encode_triton

        return encode_triton(logits, codec, clamp)
    return encode_torch(logits, codec, clamp)


def target_nll(logits, targets) -> np.ndarray:
    """Score mode: float32 NLL of each target over the full vocabulary, by the same arithmetic
    as :func:`encode_base_rows` (so ``kldtool ppl`` prints what ``kldtool base`` prints)."""
    import torch

    logits = torch.as_tensor(logits).to(torch.float32)
    mx, _, lse = normalizer_torch(logits, exact=True)
    return _nll(logits, mx + lse, targets)


def _nll(logits, norm, targets) -> np.ndarray:
    import torch

    target = torch.as_tensor(targets, dtype=torch.int64, device=logits.device)[:, None]
    return (norm - logits.gather(1, target)[:, 0].to(torch.float32)).cpu().numpy()
