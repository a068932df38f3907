"""Base files that store the base model's final hidden states (``base --store hidden``): the
stored states' dtypes and bytes, and the output head they are replayed through.

Per scored position the file keeps the output head's input (the last norm's output) in the
engine's dtype, and once the head itself: its weight, bias, and the transforms the model applies
to its logits (a multiplier for Cohere's logit scale and Granite's logits scaling, Gemma's final
soft-capping). replay.py turns each frame of hidden states back into the base logits with that
head and encodes them into the same uint16 rows a row file would hold, with the file's codec and
clamp window: every engine, reducer and the vLLM worker then read a hidden file as they read a
row file, and its statistics are comparable to a row file's by construction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from kldtool.logitsfile import ggml_head

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


@dataclass(kw_only=True)
class OutputHead:
    """The output head as the engine applies it. ``weight`` (V x d) and ``bias`` are host tensors
    in the engine's dtype, or, for llama.cpp (``ggml`` set to the GGUF tensor's type), ``weight``
    is that tensor's bytes (ggml_head.py) and the product is replayed as ggml computes it.
    ``multiplier`` scales the logits, then ``softcap`` bounds them (``cap * tanh(logits / cap)``)."""

    weight: object
    bias: object = None
    multiplier: float | None = None
    softcap: float | None = None
    ggml: str | None = None
    shape: tuple[int, int] | None = None  # (V, d), given with ``ggml`` (the bytes do not say)

    def __post_init__(self):
        if self.ggml is None:
            self.shape = tuple(int(x) for x in self.weight.shape)
        self._matrix = None

    @property
    def dtype(self) -> str:
        return ggml_head.PREFIX + self.ggml if self.ggml else str(self.weight.dtype).removeprefix("torch.")

    @property
    def state_dtype(self) -> str:
        """The dtype the engine computes the head's input in: the stored hidden states'."""
        return "float32" if self.ggml else self.dtype

    def matrix(self):
        """The weight the product uses: the tensor itself, or a GGUF head's float32 dequantized
        (a numpy array: the host replays it without torch)."""
        if self._matrix is None:
            self._matrix = ggml_head.dequantize(self.weight, self.ggml, self.shape) if self.ggml else self.weight
        return self._matrix

    def section(self) -> bytes:
        """The bytes stored once per file: the weight, then the bias (float32 beside a GGUF
        head, else the weight's dtype)."""
        parts = [np.asarray(self.weight).tobytes() if self.ggml else raw_array(self.weight).tobytes()]
        if self.bias is not None:
            parts.append(
                np.asarray(self.bias, dtype="<f4").tobytes()
                if self.ggml
                else raw_array(self.bias.to(self.weight.dtype)).tobytes()
            )
        return b"".join(parts)

    def describe(self, section: bytes) -> dict:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bias": self.bias is not None,
            "multiplier": self.multiplier,
            "softcap": self.softcap,
            "length": len(section),
            "sha256": hashlib.sha256(section).hexdigest(),
        }

    @classmethod
    def from_section(cls, data: bytes, meta: dict) -> "OutputHead":
        v, d = meta["shape"]
        dtype = meta["dtype"]
        n = weight_bytes(dtype, v, d)
        if ggml_head.is_ggml(dtype):
            weight, ggml = np.frombuffer(data, dtype=np.uint8, count=n), dtype[len(ggml_head.PREFIX) :]
            bias = np.frombuffer(data, dtype="<f4", count=v, offset=n) if meta["bias"] else None
        else:
            weight, ggml = from_raw(data[:n], dtype, (v, d)), None
            bias = from_raw(data[n:], dtype, (v,)) if meta["bias"] else None
        return cls(
            weight=weight,
            bias=bias,
            multiplier=meta.get("multiplier"),
            softcap=meta.get("softcap"),
            ggml=ggml,
            shape=(v, d),
        )

    def apply(self, hidden, weight, bias):
        """float32 logits of ``hidden`` (n x d) through ``weight`` and ``bias`` (this head's
        :meth:`matrix` and bias, where ``hidden`` lies: numpy arrays on the host for a GGUF head,
        else torch tensors on its device), computed as the engine computed them: in the head's
        own dtype (a bf16 model's logits are bf16 before anyone reads them as float32: replaying
        them in float32 would differ from the engine by its rounding), or for a GGUF head on
        activations rounded as ggml rounds them."""
        if self.ggml:
            logits = ggml_head.round_activations(hidden, self.ggml) @ weight.T
        else:
            logits = hidden.to(weight.dtype) @ weight.T
        if bias is not None:
            logits += bias
        if self.multiplier is not None:
            logits *= self.multiplier
        if self.softcap is not None:
            tanh = np.tanh if isinstance(logits, np.ndarray) else type(logits).tanh
            logits = tanh(logits / self.softcap) * self.softcap
        return logits.astype(np.float32, copy=False) if isinstance(logits, np.ndarray) else logits.float()


def weight_bytes(dtype: str, v: int, d: int) -> int:
    if ggml_head.is_ggml(dtype):
        return v * ggml_head.row_bytes(dtype[len(ggml_head.PREFIX) :], d)
    return v * d * DTYPES[dtype][1]


def expected_head_length(meta: dict) -> int:
    v, d = meta["shape"]
    bias_item = 4 if ggml_head.is_ggml(meta["dtype"]) else DTYPES[meta["dtype"]][1]
    return weight_bytes(meta["dtype"], v, d) + (v * bias_item if meta["bias"] else 0)


def is_head_dtype(dtype: str) -> bool:
    return dtype in DTYPES or ggml_head.is_ggml(dtype)
