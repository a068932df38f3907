"""A GGUF output head replayed the way llama.cpp's CPU matmul applies it.

ggml multiplies a quantized weight by activations it first converts to the weight's "vec_dot"
type: Q8_0 blocks of 32 (an fp16 scale, int8 values) for Q8_0/Q4_0/Q5_0 weights and their Q8_1
twin for Q4_1/Q5_1, Q8_K blocks of 256 (a float scale) for the K-quants, fp16 for an F16 weight,
bf16 for BF16. Replaying llama.cpp's logits from its final hidden states therefore rounds the
activations the same way before the product; a plain float32 product would carry a mean KLD of
about 1e-5 nats of its own (a Q8_0 activation block keeps 8 bits). The block arithmetic after
that (int8 sums scaled by two scales) is exact up to float32 summation order, so the replay's
floor is that of float32 rounding.

The weight is stored as the GGUF tensor's own bytes (34 bytes per 32 Q8_0 weights: the built-in
SmolLM2's tied Q8_0 head is 30 MB instead of 113 MB in float32) and dequantized once on load.
"""

from __future__ import annotations

import numpy as np

from kldtool.errors import EngineError

# ggml type: (weights per block, bytes per block, the activations' vec_dot type)
TYPES = {
    "f32": (1, 4, "f32"),
    "f16": (1, 2, "f16"),
    "bf16": (1, 2, "bf16"),
    "q8_0": (32, 34, "q8_0"),
    "q4_0": (32, 18, "q8_0"),
    "q5_0": (32, 22, "q8_0"),
    "q4_1": (32, 20, "q8_1"),
    "q5_1": (32, 24, "q8_1"),
    "q2_k": (256, 84, "q8_k"),
    "q3_k": (256, 110, "q8_k"),
    "q4_k": (256, 144, "q8_k"),
    "q5_k": (256, 176, "q8_k"),
    "q6_k": (256, 210, "q8_k"),
}
PREFIX = "ggml-"  # a head dtype "ggml-q8_0" is llama.cpp's tensor, not a torch dtype


def is_ggml(dtype: str) -> bool:
    return dtype.startswith(PREFIX) and dtype[len(PREFIX) :] in TYPES


def row_bytes(ggml_type: str, dim: int) -> int:
    per, size, _ = TYPES[ggml_type]
    if dim % per:
        raise ValueError(f"a {ggml_type} row of {dim} weights is not a whole number of {per}-weight blocks")
    return dim // per * size


def dequantize(raw: np.ndarray, ggml_type: str, shape: tuple[int, int]) -> np.ndarray:
    """The float32 weight (V x d) of a GGUF tensor's bytes."""
    v, d = shape
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(v, row_bytes(ggml_type, d))
    if ggml_type == "f32":
        w = raw.view("<f4")
    elif ggml_type == "f16":
        w = raw.view("<f2").astype(np.float32)
    elif ggml_type == "bf16":
        w = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ggml_type == "q8_0":
        blocks = raw.reshape(v, d // 32, 34)
        scale = blocks[:, :, :2].copy().view("<f2").astype(np.float32)
        w = (blocks[:, :, 2:].view(np.int8).astype(np.float32) * scale).reshape(v, d)
    else:  # the other block types through gguf's reference dequantizers
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize as gguf_dequantize
        except ImportError:
            raise EngineError(
                f"replaying a {ggml_type} output head needs the gguf package (pip install gguf)"
            ) from None
        w = gguf_dequantize(raw, GGMLQuantizationType[ggml_type.upper()]).reshape(v, d).astype(np.float32)
    return np.ascontiguousarray(w, dtype=np.float32)


def round_activations(x, ggml_type: str):
    """``x`` (n x d, float32; a numpy array or a torch tensor) as ggml converts it for a
    ``ggml_type`` weight, in float32: the values its vec_dot kernel multiplies (x86's rounding,
    half to even). A Q8_0 (or Q8_1) block of 32 is scaled by its largest magnitude / 127 held
    as fp16; a Q8_K block of 256 by -127 over its signed value of largest magnitude (the first
    on a tie), as a float."""
    kind = TYPES[ggml_type][2]
    if isinstance(x, np.ndarray):
        return _round_np(np.asarray(x, dtype=np.float32), kind)
    return _round_torch(x, kind)


def _round_np(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "f32":
        return x
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    n, d = x.shape
    with np.errstate(divide="ignore"):
        if kind == "q8_k":
            b = x.reshape(n, d // 256, 256)
            big = np.take_along_axis(b, np.abs(b).argmax(axis=2)[..., None], axis=2)
            iscale = np.where(big != 0, np.float32(-127.0) / big, np.float32(0))
            scale = np.where(big != 0, np.float32(1.0) / iscale, np.float32(0))
            return (np.minimum(np.round(iscale * b), 127) * scale).reshape(n, d)
        b = x.reshape(n, d // 32, 32)
        amax = np.abs(b).max(axis=2, keepdims=True)
        scale = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0))
    return (np.round(b * inv) * scale).reshape(n, d)


def _round_torch(x, kind: str):
    import torch

    x = x.to(torch.float32)
    if kind == "f32":
        return x
    if kind in ("f16", "bf16"):
        return x.to(torch.float16 if kind == "f16" else torch.bfloat16).to(torch.float32)
    n, d = x.shape
    if kind == "q8_k":
        b = x.reshape(n, d // 256, 256)
        big = torch.gather(b, 2, b.abs().argmax(dim=2, keepdim=True))
        iscale = torch.where(big != 0, -127.0 / big, torch.zeros_like(big))
        scale = torch.where(big != 0, 1.0 / iscale, torch.zeros_like(big))
        return (torch.clamp(torch.round(iscale * b), max=127) * scale).reshape(n, d)
    b = x.reshape(n, d // 32, 32)
    amax = b.abs().amax(dim=2, keepdim=True)
    scale = (amax / 127.0).to(torch.float16).to(torch.float32)
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(b * inv) * scale).reshape(n, d)


def gguf_head(path: str, arch_hint: str | None = None) -> dict:
    """The output head llama.cpp applies for the GGUF model at ``path``: its tensor
    (``output.weight``, else the tied ``token_embd.weight``) and the logit transforms the
    architecture's graph applies after it."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise EngineError("--store hidden with the llamacpp engine needs the gguf package (pip install gguf)") from None
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise EngineError(f"{path}: no output.weight or token_embd.weight tensor")
    ggml_type = t.tensor_type.name.lower()
    if ggml_type not in TYPES:
        raise EngineError(
            f"{path}: its output head {t.name} is of type {ggml_type}, which kldtool cannot replay "
            f"({', '.join(TYPES)}); use --store logprobs"
        )
    d, v = (int(x) for x in t.shape[:2])  # GGUF lists the fastest dimension first
    fields = reader.fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.contents()

    arch = arch_hint or value("general.architecture")
    softcap = value(f"{arch}.final_logit_softcapping")
    scale = value(f"{arch}.logit_scale")
    # llama.cpp's graphs: Cohere multiplies the logits by logit_scale, Granite divides by it
    multiplier = None
    if scale not in (None, 0, 1.0):
        multiplier = 1.0 / scale if arch.startswith("granite") else float(scale)
    return {
        "name": t.name,
        "type": ggml_type,
        "shape": (v, d),
        "data": np.asarray(t.data).view(np.uint8).reshape(-1),
        "multiplier": multiplier,
        "softcap": float(softcap) if softcap else None,
    }
