"""Base files that store the base model's final hidden states (``base --store hidden``).

Per scored position the file keeps the output head's input (the last norm's output) in the
engine's dtype, and once the head itself: its weight, bias, and the transforms the model applies
to its logits (a multiplier for Cohere's logit scale and Granite's logits scaling, Gemma's final
soft-capping). A reader turns each frame of hidden states back into the base logits with that
head and encodes them into the same uint16 rows a row file would hold, with the file's codec and
clamp window: every engine, reducer and the vLLM worker then read a hidden file as they read a
row file, and its statistics are comparable to a row file's by construction.

How exactly the replay reproduces the engine's logits is measured while writing (the replay
probe, ``replay`` in the metadata) and printed by ``info`` and ``compare``.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass

import numpy as np

# Stored hidden-state dtypes: their item size and how their bytes are viewed (bf16 as raw uint16).
DTYPES = {"float32": ("<f4", 4), "float16": ("<f2", 2), "bfloat16": ("<u2", 2)}


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def raw_array(t) -> np.ndarray:
    """A hidden-state or weight tensor as a host numpy array of its own bytes (bf16 as uint16)."""
    import torch

    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2")
    return t.numpy()


def from_raw(data, dtype: str, shape, device=None):
    """The tensor of ``dtype`` whose bytes are ``data`` (bytes, a numpy array or a uint8 tensor)."""
    import torch

    if isinstance(data, torch.Tensor):
        buf = data
    else:
        buf = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    if device is not None:
        buf = buf.to(device)
    return buf.view(torch_dtype(dtype)).reshape(shape)


@dataclass
class OutputHead:
    """The output head as the engine applies it. ``weight`` (V x d) and ``bias`` are host tensors
    in the engine's dtype; ``multiplier`` scales the logits, then ``softcap`` bounds them
    (``cap * tanh(logits / cap)``)."""

    weight: object
    bias: object = None
    multiplier: float | None = None
    softcap: float | None = None

    @property
    def dtype(self) -> str:
        return str(self.weight.dtype).removeprefix("torch.")

    def section(self) -> bytes:
        """The bytes stored once per file: the weight, then the bias (same dtype)."""
        parts = [raw_array(self.weight).tobytes()]
        if self.bias is not None:
            parts.append(raw_array(self.bias.to(self.weight.dtype)).tobytes())
        return b"".join(parts)

    def describe(self, section: bytes) -> dict:
        return {"dtype": self.dtype, "shape": list(self.weight.shape), "bias": self.bias is not None,
                "multiplier": self.multiplier, "softcap": self.softcap, "length": len(section),
                "sha256": hashlib.sha256(section).hexdigest()}

    @classmethod
    def from_section(cls, data: bytes, meta: dict) -> "OutputHead":
        v, d = meta["shape"]
        _, item = DTYPES[meta["dtype"]]
        weight = from_raw(data[:v * d * item], meta["dtype"], (v, d))
        bias = from_raw(data[v * d * item:], meta["dtype"], (v,)) if meta["bias"] else None
        return cls(weight, bias, meta.get("multiplier"), meta.get("softcap"))


def expected_head_length(meta: dict) -> int:
    v, d = meta["shape"]
    return (v * d + (v if meta["bias"] else 0)) * DTYPES[meta["dtype"]][1]


def apply_head(hidden, weight, bias, multiplier, softcap):
    """float32 logits of ``hidden`` (n x d) through the head, computed in the head's own dtype
    as the engine computed them (a bf16 model's logits are bf16 before anyone reads them as
    float32: replaying them in float32 would differ from the engine by its rounding)."""
    import torch

    logits = hidden.to(weight.dtype) @ weight.T
    if bias is not None:
        logits += bias
    if multiplier is not None:
        logits *= multiplier
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits.to(torch.float32)


class Replayer:
    """The head on each device it is asked for, loaded once (prefetch threads share it)."""

    def __init__(self, load_head):
        self._load = load_head
        self._lock = threading.Lock()
        self._head: OutputHead | None = None
        self._on: dict = {}

    def head(self) -> OutputHead:
        with self._lock:
            if self._head is None:
                self._head = self._load()
            return self._head

    def logits(self, hidden):
        key = str(hidden.device)
        head = self.head()
        with self._lock:
            if key not in self._on:
                self._on[key] = (head.weight.to(hidden.device),
                                 None if head.bias is None else head.bias.to(hidden.device))
            w, b = self._on[key]
        return apply_head(hidden, w, b, head.multiplier, head.softcap)


class ReplayProbe:
    """The base phase's check of its own file: the engine's logits against those replayed from
    the hidden states it stores, as KLD(engine || replay) in float64 and the largest |Δlogit|."""

    def __init__(self, head: OutputHead, chunks: int):

        self.chunks_left = chunks
        self.head = head
        self.sum = 0.0
        self.count = 0
        self.kld_max = 0.0
        self.dlogit_max = 0.0
        self.chunks = 0

    def add(self, stored_hidden, logits) -> None:
        import torch

        h = self.head
        replay = apply_head(stored_hidden.cpu(), h.weight, h.bias, h.multiplier, h.softcap)
        ref = logits.detach().cpu().to(torch.float64)
        lp, lq = torch.log_softmax(ref, dim=1), torch.log_softmax(replay.to(torch.float64), dim=1)
        kld = (lp.exp() * (lp - lq)).sum(dim=1)
        self.sum += float(kld.sum())
        self.count += len(kld)
        self.kld_max = max(self.kld_max, float(kld.max()))
        self.dlogit_max = max(self.dlogit_max, float((ref - replay.to(torch.float64)).abs().max()))

    def result(self) -> dict:
        mean = self.sum / self.count if self.count else math.nan
        return {"chunks": self.chunks, "tokens": self.count, "kld_mean": mean, "kld_max": self.kld_max,
                "max_abs_dlogit": self.dlogit_max}
