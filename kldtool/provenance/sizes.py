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
_ST_PART = re.compile(
    r"^(?P<module>.+)\.(?P<part>weight|weight_packed|weight_scale|weight_zero_point|"
    r"weight_g_idx|weight_shape|weight_global_scale)$"
)
_ST_LAYER = re.compile(r"(^|\.)layers\.\d+\.")
_ST_EMBED_HEAD = re.compile(r"(^|\.)(embed_tokens|lm_head|wte|embed_out)$")


@dataclass(kw_only=True)
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
    lin = [0, 0]
    emb = [0, 0]
    for name, n_elements, n_bytes in _gguf_tensors(path):
        bucket = lin if _GGUF_LINEAR.match(name) else emb if name in _GGUF_EMBED_HEAD else None
        if bucket is not None:
            bucket[0] += n_elements
            bucket[1] += n_bytes
    return ModelSize(
        path=path,
        format="gguf",
        file_bytes=os.path.getsize(path),
        linear_params=lin[0],
        linear_bytes=lin[1],
        embed_head_params=emb[0],
        embed_head_bytes=emb[1],
    )


# ggml tensor types -> (weights per block, bytes per block) for the float and llama-quantize
# types; any other comes from the gguf package, whose import beside vLLM pulls in
# mistral_common, so the common types do not wait for it.
_GGML_BLOCKS = {
    0: (1, 4),
    1: (1, 2),
    30: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
}


def _ggml_block(ggml_type: int) -> tuple[int, int]:
    if ggml_type in _GGML_BLOCKS:
        return _GGML_BLOCKS[ggml_type]
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[ggml_type]


# GGUF metadata value types (by their number) -> fixed byte size; 8 is a string, 9 an array.
_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _gguf_tensors(path: str) -> list[tuple[str, int, int]]:
    """(name, elements, bytes) of every tensor, from the header alone. The gguf package's
    reader decodes all metadata into numpy views first (seconds for a vocabulary's strings, on
    every compare); this walks past it."""
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _walk_gguf(buf)
    except (OSError, struct.error, ValueError, KeyError, OverflowError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _walk_gguf(buf) -> list[tuple[str, int, int]]:
    """The header's key/value section skipped by its lengths, then its tensor infos read."""
    pos = 0
    u64 = struct.Struct("<Q").unpack_from

    def take(fmt: str):
        nonlocal pos
        got = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return got

    def skip_strings(count: int) -> None:
        # A vocabulary's token and merge lists are ~100k strings: one lookup each, no calls
        # beyond it (a general walk is slow at every compare's end).
        nonlocal pos
        p = pos
        for _ in range(count):
            p += 8 + u64(buf, p)[0]
        pos = p

    def skip_value(kind: int) -> None:
        nonlocal pos
        if kind in _GGUF_SCALAR:
            pos += _GGUF_SCALAR[kind]
        elif kind == 8:
            skip_strings(1)
        elif kind == 9:
            elem, count = take("<IQ")
            if elem in _GGUF_SCALAR:
                pos += count * _GGUF_SCALAR[elem]
            elif elem == 8:
                skip_strings(count)
            else:
                for _ in range(count):
                    skip_value(elem)
        else:
            raise ValueError(f"metadata value type {kind} at byte {pos}")

    magic, ver, n_tensors, n_kv = take("<4sIQQ")
    if magic != b"GGUF" or ver < 2:
        raise ValueError(f"magic {magic!r}, version {ver}")
    for _ in range(n_kv):
        skip_strings(1)
        skip_value(take("<I")[0])
    tensors = []
    for _ in range(n_tensors):
        n = take("<Q")[0]
        name = bytes(buf[pos : pos + n]).decode("utf-8")
        pos += n
        dims = take(f"<{take('<I')[0]}Q")
        ggml_type = take("<IQ")[0]
        n_elements = _count(dims)
        block, type_bytes = _ggml_block(ggml_type)
        tensors.append((name, n_elements, n_elements // block * type_bytes))
    return tensors


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
    return ModelSize(
        path=path,
        format="safetensors",
        file_bytes=sum(os.path.getsize(f) for f in files),
        linear_params=lin[0],
        linear_bytes=lin[1],
        embed_head_params=emb[0],
        embed_head_bytes=emb[1],
    )


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
