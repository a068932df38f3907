"""How big a model is: bytes on disk and bits per weight, GGUF and safetensors alike.

Two bits-per-weight figures, defined here once so every table and plot means the same thing:
- ``bpw_linear``: the decoder's linear layers (attention and MLP matrices) only, counting every
  byte that encodes them (quantized values, scales, zero points, group indices), not biases
  or norms. This is the figure quantization papers quote.
- ``bpw_total``: the same plus the token embeddings and the output head (once if tied).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import asdict, dataclass

from kldtool.errors import UsageError

# GGUF: per-layer 2-D weights of attention and MLP (llama.cpp's tensor names).
_GGUF_LINEAR = re.compile(r"^blk\.\d+\.(attn_(q|k|v|qkv|output)|ffn_(up|gate|down|gate_up))(_exps)?\.weight$")
_GGUF_EMBED_HEAD = {"token_embd.weight", "output.weight"}
# safetensors: the tensors of one linear module, quantized or not (compressed-tensors names).
_ST_PART = re.compile(r"^(?P<module>.+)\.(?P<part>weight|weight_packed|weight_scale|weight_zero_point|"
                      r"weight_g_idx|weight_shape|weight_global_scale)$")
_ST_LAYER = re.compile(r"(^|\.)layers\.\d+\.")
_ST_EMBED_HEAD = re.compile(r"(^|\.)(embed_tokens|lm_head|wte|embed_out)$")


@dataclass
class ModelSize:
    path: str
    format: str  # "gguf" or "safetensors"
    file_bytes: int  # everything on disk that holds tensors
    linear_params: int
    linear_bytes: int
    embed_head_params: int
    embed_head_bytes: int

    @property
    def bpw_linear(self) -> float:
        return 8.0 * self.linear_bytes / self.linear_params if self.linear_params else float("nan")

    @property
    def bpw_total(self) -> float:
        n = self.linear_params + self.embed_head_params
        return 8.0 * (self.linear_bytes + self.embed_head_bytes) / n if n else float("nan")

    def as_dict(self) -> dict:
        return asdict(self) | {"bpw_linear": self.bpw_linear, "bpw_total": self.bpw_total}


def model_size(path: str) -> ModelSize | None:
    """Size of a .gguf file or a directory of .safetensors; None for anything else
    (a hub name, a directory of .bin files)."""
    if os.path.isfile(path) and path.endswith(".gguf"):
        return _gguf_size(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if files:
            return _safetensors_size(path, files)
    return None


def model_size_dict(model) -> dict | None:
    """:func:`model_size` as the dict results carry, or None (no model, or not a local file)."""
    size = model_size(str(model)) if model else None
    return size.as_dict() if size else None


def _gguf_size(path: str) -> ModelSize:
    import gguf

    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the gguf package raises bare ValueError/struct errors on bad files
        raise UsageError(f"{path}: not a readable GGUF file ({e})") from e
    lin = [0, 0]
    emb = [0, 0]
    for t in reader.tensors:
        bucket = lin if _GGUF_LINEAR.match(t.name) else emb if t.name in _GGUF_EMBED_HEAD else None
        if bucket is not None:
            bucket[0] += int(t.n_elements)
            bucket[1] += int(t.n_bytes)
    return ModelSize(path, "gguf", os.path.getsize(path), lin[0], lin[1], emb[0], emb[1])


def _safetensors_header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise UsageError(f"{path}: not a safetensors file (shorter than its header length)")
        n = struct.unpack("<Q", raw)[0]
        if n > 100 << 20:
            raise UsageError(f"{path}: not a safetensors file (header length {n})")
        try:
            return json.loads(f.read(n)), 8 + n
        except ValueError as e:
            raise UsageError(f"{path}: not a safetensors file (header is not JSON: {e})") from e


def _read_ints(path: str, offset: int, dtype: str, begin: int, end: int) -> list[int]:
    fmt = {"I64": "q", "I32": "i", "U64": "Q", "U32": "I"}[dtype]
    with open(path, "rb") as f:
        f.seek(offset + begin)
        data = f.read(end - begin)
    return list(struct.unpack("<" + fmt * (len(data) // struct.calcsize(fmt)), data))


def _safetensors_size(path: str, files: list[str]) -> ModelSize:
    modules: dict[str, dict] = {}
    for file in files:
        header, data_start = _safetensors_header(file)
        for name, t in header.items():
            m = _ST_PART.match(name)
            if name == "__metadata__" or not m:
                continue
            begin, end = t["data_offsets"]
            mod = modules.setdefault(m["module"], {"bytes": 0, "params": 0, "shape": None, "matrix": False})
            if m["part"] == "weight_shape":
                mod["shape"] = _read_ints(file, data_start, t["dtype"], begin, end)
                mod["matrix"] = True
                continue
            mod["bytes"] += end - begin
            if m["part"] == "weight":
                mod["params"] = _count(t["shape"])
                mod["matrix"] = mod["matrix"] or len(t["shape"]) >= 2
    lin = [0, 0]
    emb = [0, 0]
    for name, mod in modules.items():
        params = _count(mod["shape"]) if mod["shape"] else mod["params"]
        bucket = emb if _ST_EMBED_HEAD.search(name) else lin if _ST_LAYER.search(name) else None
        if bucket is lin and not mod["matrix"]:
            continue  # a norm's 1-D weight
        if bucket is not None:
            bucket[0] += params
            bucket[1] += mod["bytes"]
    return ModelSize(path, "safetensors", sum(os.path.getsize(f) for f in files), lin[0], lin[1], emb[0], emb[1])


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
