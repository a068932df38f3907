"""GGUF helpers for tests and sweeps: requantize with llama.cpp, flip the add-BOS flag."""

from __future__ import annotations

import ctypes
import os
import shutil

from kldtool.errors import EngineError, UsageError


def quantize(src: str, dst: str, type_name: str, threads: int | None = None) -> None:
    """``llama-quantize --allow-requantize SRC DST TYPE`` through llama-cpp-python (atomic)."""
    import llama_cpp as lib

    from kldtool.engines.llamacpp.load import silence_llama_logs

    silence_llama_logs(lib)
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{type_name.upper()}", None)
    if ftype is None:
        raise UsageError(f"unknown GGUF quant type {type_name!r} (e.g. Q8_0, Q6_K, Q4_K_M, Q2_K)")
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = threads or os.cpu_count() or 1
    tmp = f"{dst}.partial-{os.getpid()}"
    rc = lib.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise EngineError(f"{src}: quantizing to {type_name} failed (code {rc})")
    os.replace(tmp, dst)


def copy_with_add_bos(src: str, dst: str, add_bos: bool = True) -> None:
    """Copy a GGUF and set ``tokenizer.ggml.add_bos_token`` in place (the field must exist)."""
    import gguf

    tmp = f"{dst}.partial-{os.getpid()}"
    shutil.copyfile(src, tmp)
    try:
        reader = gguf.GGUFReader(tmp, "r+")
        field = reader.fields.get("tokenizer.ggml.add_bos_token")
        if field is None:
            raise EngineError(f"{src}: has no tokenizer.ggml.add_bos_token field to set")
        field.parts[field.data[0]][0] = 1 if add_bos else 0
        del reader
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
