"""The experts a llama.cpp MoE model's routers chose, read from its own graph: llama.cpp's
scheduler hands each tensor it computes to the context's eval callback (``cb_eval``), and its
mixture layers name their router's scores ``ffn_moe_probs-L`` (softmax or sigmoid, experts x
tokens) and the chosen ids ``ffn_moe_topk-L`` (k x tokens, a view of the sorted ids). Only
those two tensors of each layer are asked for; a decode's rows are filed under the window the
engine says it is decoding, one window per decode, so every row's position is known."""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np

from kldtool.errors import EngineError
from kldtool.routing.rows import Routed, RouterShape, chosen_probs

_WANTED = re.compile(rb"^ffn_moe_(probs|topk)-(\d+)$")
GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func values
# struct ggml_tensor (ggml.h): type at 0, ne[4] at 16, nb[4] at 48, data at 248, name at 256. The
# layout is checked against ggml_get_name and ggml_nbytes on the first tensor of every decode.
NE, NB, DATA, NAME = 16, 48, 248, 256
I32, F32 = 26, 0


def _ggml(lib):
    base = ctypes.CDLL(os.path.join(os.path.dirname(lib.__file__), "lib", "libggml-base.so"))
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    base.ggml_backend_buffer_is_host.restype = ctypes.c_bool
    base.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
    return base


def _meta(lib, model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


def router_shape(lib, model) -> RouterShape | None:
    """From the GGUF's keys: experts, experts per token, the dense lead layers, the scoring."""
    arch = _meta(lib, model, "general.architecture")
    if not arch:
        return None
    n_experts = int(_meta(lib, model, f"{arch}.expert_count") or 0)
    if not n_experts:
        return None
    k = int(_meta(lib, model, f"{arch}.expert_used_count") or 0)
    blocks = int(_meta(lib, model, f"{arch}.block_count") or 0)
    dense = int(_meta(lib, model, f"{arch}.leading_dense_block_count") or 0)
    gating = GATING.get(int(_meta(lib, model, f"{arch}.expert_gating_func") or 1))
    if not gating or not 0 < k <= n_experts:
        return None
    return RouterShape(tuple(range(dense, blocks)), k, n_experts, gating)


def _array(t: int, ggml) -> np.ndarray:
    """A host tensor of ggml type I32 or F32 as a (tokens, row) numpy copy, strides honoured."""
    typ = ctypes.c_int32.from_address(t).value
    ne = np.ctypeslib.as_array(ctypes.cast(t + NE, ctypes.POINTER(ctypes.c_int64)), (4,))
    nb = np.ctypeslib.as_array(ctypes.cast(t + NB, ctypes.POINTER(ctypes.c_uint64)), (4,))
    name = ctypes.string_at(t + NAME)
    if name != ggml.ggml_get_name(t) or typ not in (I32, F32) or nb[0] != 4 or ne[2] * ne[3] != 1:
        raise EngineError("this llama.cpp build's ggml_tensor layout is not the one kldtool reads routing from")
    buffer = ctypes.c_void_p.from_address(t + 8).value
    if not buffer or not ggml.ggml_backend_buffer_is_host(buffer):
        raise EngineError("llama.cpp keeps its router tensors off the host: routing is read on the CPU build only")
    n, width = int(ne[1]), int(ne[0])
    data = ctypes.c_void_p.from_address(t + DATA).value
    span = int(nb[1]) * (n - 1) + 4 * width
    raw = np.frombuffer((ctypes.c_char * span).from_address(data), np.int32 if typ == I32 else np.float32)
    return np.lib.stride_tricks.as_strided(raw, (n, width), (int(nb[1]), 4)).copy()


class LlamaRouterTap:
    """The context's eval callback and what it caught. ``window`` is set by the engine before
    each decode; :meth:`decoded` files the decode's scored rows under it."""

    def __init__(self, lib, shape: RouterShape, kept: dict | None = None):
        self.lib, self.shape, self.ggml = lib, shape, _ggml(lib)
        self.caught: dict[tuple[str, int], list[np.ndarray]] = {}
        self.kept: dict[int, list[Routed]] = {} if kept is None else kept
        self.window, self.error = None, None
        self.callback = lib.ggml_backend_sched_eval_callback(self._seen)  # kept alive with the tap

    def twin(self) -> "LlamaRouterTap":
        """A tap for another context on the same model (a lane): its own callback and decode
        state, the rows filed into this tap's."""
        return LlamaRouterTap(self.lib, self.shape, self.kept)

    def _seen(self, t, ask, user_data) -> bool:
        try:  # nothing may raise into llama.cpp's scheduler: the error waits for decoded()
            m = _WANTED.match(self.ggml.ggml_get_name(t) or b"")
            if ask or not m:
                return bool(m)
            self.caught.setdefault((m.group(1).decode(), int(m.group(2))), []).append(_array(t, self.ggml))
        except Exception as e:  # noqa: BLE001
            self.error = self.error or e
        return True

    def decoded(self, items) -> None:
        """After a decode of ``items`` (token, position, sequence, wants logits) of one window."""
        caught, self.caught = self.caught, {}
        if self.error:
            error, self.error = self.error, None
            raise error if isinstance(error, EngineError) else EngineError(f"llama.cpp routing: {error}")
        w, s = self.window, self.shape
        pos = np.array([it[1] for it in items])
        out = np.array([bool(it[3]) for it in items])
        keep = (pos >= w.first) & (pos < w.first + w.n_scored)
        layers = sorted({layer for _, layer in caught})
        if layers != list(s.layers):
            raise EngineError(f"llama.cpp routed layers {layers}, the GGUF's keys say {list(s.layers)}")
        ids, scores = [], []
        for layer in s.layers:
            got = [np.concatenate(caught[(kind, layer)]) for kind in ("topk", "probs")]
            # llama.cpp's last layer computes only the rows that output logits.
            if len(got[0]) not in (len(items), out.sum()):
                raise EngineError(f"llama.cpp layer {layer} routed {len(got[0])} rows of a {len(items)}-token decode")
            rows = keep if len(got[0]) == len(items) else keep[out]
            ids.append(got[0][rows])
            scores.append(got[1][rows])
        ids_np = np.stack(ids, axis=1).astype(np.int16)
        scores_np = np.stack(scores, axis=1)
        routed = Routed(ids_np, chosen_probs(scores_np, ids_np).astype(np.float32), scores_np)
        self.kept.setdefault(w.index, []).append(routed)

    def pop(self, index: int) -> Routed:
        return Routed.concat(self.kept.pop(index))
