"""llama-cpp-python's library quieted, and a GGUF model loaded on a thread while the command's
own start-up runs.

llama.cpp reads (and repacks) the weights in C with the interpreter released, while a command,
before it asks for its engine, is still importing and checking in Python. ``start`` begins the
load there, ``take`` hands the
model to the engine built for that file, and ``drop`` lets go of any nobody took (a command that
failed first, or built its engine for another file).
"""

from __future__ import annotations

import ctypes
import os
import threading

from kldtool.engines.llamacpp.offload import Offload
from kldtool.errors import UsageError

_loads: dict[tuple[str, Offload], "_Load"] = {}
_lock = threading.Lock()

_LOG_CALLBACK = None  # kept alive for as long as llama.cpp may call it
_log_lock = threading.Lock()  # the loading thread and an engine may both ask


def silence_llama_logs(lib) -> None:
    global _LOG_CALLBACK
    with _log_lock:
        if _LOG_CALLBACK is None:
            _LOG_CALLBACK = lib.llama_log_callback(lambda level, text, user: None)
            lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


class _Load:
    def __init__(self, path: str, offload: Offload):
        self.path = path
        self.offload = offload
        self.model = None
        self.lib = None
        self.dropped = False
        self.done = threading.Event()
        threading.Thread(target=self._run, name="kldtool-model-load", daemon=True).start()

    def _run(self) -> None:
        try:
            import llama_cpp as lib

            silence_llama_logs(lib)
            lib.llama_backend_init()
            self.lib = lib
            self.model = lib.llama_model_load_from_file(self.path.encode(), self.offload.model_params(lib)) or None
        except Exception:  # the engine loads the file itself and reports what goes wrong
            self.model = None
        finally:
            with _lock:
                self.done.set()
                if self.dropped:
                    self._free()

    def _free(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
        self.model = None


def start(path: str | None, flags: dict) -> None:
    """Begin loading the GGUF at ``path`` (None: the built-in one) on a thread, placed as the
    command's ``flags`` say (once; nothing for a path that is no file, nor for offload
    flags the engine will refuse)."""
    if path is None:
        from kldtool.engines import defaults

        path = defaults.default_gguf()
    if not os.path.isfile(path):
        return
    try:
        offload = Offload.from_flags(flags)
    except UsageError:
        return
    with _lock:
        key = (os.path.realpath(path), offload)
        if key not in _loads:
            _loads[key] = _Load(path, offload)


def take(path: str, offload: Offload):
    """The model loaded for ``path`` with ``offload`` once its load ends, or None if none was
    started or it failed."""
    with _lock:
        load = _loads.pop((os.path.realpath(path), offload), None)
    if load is None:
        return None
    load.done.wait()
    return load.model


def placed(lib, path: str, offload: Offload):
    """The model at ``path`` placed as ``offload`` says: the one loaded early with those
    settings, else loaded now (None where llama.cpp cannot); GPU indices checked first."""
    from kldtool.engines.llamacpp.backend import check_devices

    check_devices(lib, offload)
    return take(path, offload) or lib.llama_model_load_from_file(path.encode(), offload.model_params(lib))


def drop() -> None:
    """Free the loaded models nobody took; one still loading is freed by its thread when done."""
    with _lock:
        loads = list(_loads.values())
        _loads.clear()
        for load in loads:
            load.dropped = True
            if load.done.is_set():
                load._free()


def cpu_features(lib) -> str:
    """The instruction sets this llama.cpp build's CPU kernels use ("SSE3 AVX AVX2 ..."):
    an AVX-512 build computes other logits than an AVX2 one."""
    info = lib.llama_print_system_info().decode("utf-8", "replace")
    pairs = (p.partition("=") for p in info.split("|"))
    return " ".join(k.split(":")[-1].strip() for k, _, v in pairs if v.strip() == "1") or "unknown"


def vocab_decoder(path: str):
    """ids -> text through a GGUF's tokenizer alone (its weights are not loaded)."""
    import llama_cpp

    silence_llama_logs(llama_cpp)
    llama = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    return lambda ids: llama.detokenize([int(i) for i in ids], special=True).decode("utf-8", "replace")
