"""`kldtool quantize`: llama-quantize through llama-cpp-python, written atomically."""

from __future__ import annotations

import ctypes
import os

from kldtool.errors import EngineError, UsageError

# llama-quantize's own names for the K-quant mixes: Q4_K is Q4_K_M (with --pure, every tensor q4_k).
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


def ftype_of(type_name: str, where: str = "") -> int:
    """llama.cpp's file type for llama-quantize's name of it."""
    import llama_cpp as lib

    # F32 is llama.cpp's one "ALL_" type: every tensor in float32 (a quant's fp32 form)
    name = ALIASES.get(type_name.upper(), type_name.upper())
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{name}", getattr(lib, f"LLAMA_FTYPE_ALL_{name}", None))
    if ftype is None:
        at = f"{where}: " if where else ""
        raise UsageError(f"{at}unknown GGUF quant type {type_name!r} (e.g. F32, Q8_0, Q6_K, Q4_K_M, Q2_K)")
    return ftype


def quantize(
    src: str, dst: str, type_name: str, threads: int | None = None, types: list = (), pure: bool = False
) -> None:
    """``llama-quantize --allow-requantize [--pure] [--tensor-type ...] SRC DST TYPE`` through
    llama-cpp-python (atomic); ``types``: tensor_types.TensorType lines, checked beforehand."""
    import llama_cpp as lib

    from kldtool.engines.llamacpp.load import silence_llama_logs
    from kldtool.engines.llamacpp.tensor_types import overrides_array

    silence_llama_logs(lib)
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype_of(type_name)
    params.allow_requantize = True
    params.nthread = threads or os.cpu_count() or 1
    params.pure = pure
    overrides = overrides_array(lib, list(types)) if types else None  # alive until llama.cpp returns
    if overrides is not None:
        params.tt_overrides = ctypes.cast(overrides, ctypes.POINTER(lib.llama_model_tensor_override))
    tmp = f"{dst}.partial-{os.getpid()}"
    rc = lib.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise EngineError(f"{src}: quantizing to {type_name} failed (code {rc})")
    os.replace(tmp, dst)
