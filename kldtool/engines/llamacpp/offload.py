"""Where llama.cpp puts a model: llama-perplexity's offload flags, with its names and meanings.

``-ngl/--n-gpu-layers`` (a number or ``all``; default all, llama.cpp's own default), ``-sm/
--split-mode`` (none, layer, row or tensor), ``-mg/--main-gpu``, ``-ts/--tensor-split`` (one
proportion per GPU) and ``-nkvo/--no-kv-offload``. They become the fields of llama.cpp's model
and context parameters; on a build that cannot offload they change nothing, and the engine says
so once (engine.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from kldtool.errors import UsageError

SPLIT_MODES = ("none", "layer", "row", "tensor")  # llama.h's LLAMA_SPLIT_MODE_*, in its order
ALL = -1  # llama.cpp's model parameters: a negative layer count offloads every layer


@dataclass(kw_only=True, frozen=True)
class Offload:
    n_gpu_layers: int = ALL
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    kv_offload: bool = True

    @classmethod
    def from_flags(cls, flags: dict) -> "Offload":
        """The flags' values (name -> value; unset ones None or False), checked: a one-line
        usage error that names the flag and its value."""
        ngl, sm, mg, ts = (flags.get(k) for k in ("n_gpu_layers", "split_mode", "main_gpu", "tensor_split"))
        layers = ALL if ngl is None else _layers(str(ngl))
        mode = "layer" if sm is None else sm.lower()
        if mode not in SPLIT_MODES:
            raise UsageError(f"--split-mode {sm}: one of {', '.join(SPLIT_MODES)}")
        if mg is not None and mg < 0:
            raise UsageError(f"--main-gpu {mg}: a GPU's index, 0 or more")
        return cls(
            n_gpu_layers=layers,
            split_mode=mode,
            main_gpu=mg or 0,
            tensor_split=_proportions(ts) if ts is not None else (),
            kv_offload=not flags.get("no_kv_offload"),
        )

    @property
    def asks_for_gpu(self) -> bool:
        """Whether any flag was given that only a GPU build can act on (offloading every layer,
        the default, is what any build does with what it has)."""
        return self != Offload() and self != Offload(n_gpu_layers=0)

    def model_params(self, lib):
        """llama.cpp's model parameters with these settings (ctypes keeps the tensor split's
        array alive with them: llama.cpp reads it when the model loads)."""
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = self.n_gpu_layers
        mp.split_mode = SPLIT_MODES.index(self.split_mode)
        mp.main_gpu = self.main_gpu
        if self.tensor_split:
            n = int(lib.llama_max_devices())
            if len(self.tensor_split) > n:
                raise UsageError(
                    f"--tensor-split {','.join(f'{p:g}' for p in self.tensor_split)}: this llama.cpp build "
                    f"takes at most {n} devices"
                )
            mp.tensor_split = (ctypes.c_float * n)(*self.tensor_split)
        return mp

    def apply(self, cp) -> None:
        """Set the context's part (the KV cache and attention on the GPU, or not) on ``cp``."""
        cp.offload_kqv = self.kv_offload

    def describe(self) -> dict:
        return {
            "n_gpu_layers": "all" if self.n_gpu_layers < 0 else self.n_gpu_layers,
            "split_mode": self.split_mode,
            "main_gpu": self.main_gpu,
            "tensor_split": list(self.tensor_split) or None,
            "kv_offload": self.kv_offload,
        }


def _layers(value: str) -> int:
    if value.lower() == "all":
        return ALL
    if value.lower() == "auto":
        raise UsageError(
            "--n-gpu-layers auto: llama-perplexity's fitting to free memory lives in its own front end, "
            "not in the library kldtool calls; give a number of layers or all"
        )
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"--n-gpu-layers {value}: a number of layers or all") from None
    if n < 0:
        raise UsageError(f"--n-gpu-layers {value}: a number of layers (0 or more) or all")
    return n


def _proportions(text: str) -> tuple[float, ...]:
    """llama-perplexity's -ts: proportions separated by commas or slashes ("3,1")."""
    import math
    import re

    parts = [p for p in re.split(r"[,/]+", text.strip()) if p != ""]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise UsageError(f"--tensor-split {text}: proportions separated by commas, e.g. 3,1") from None
    if not values or any(not math.isfinite(v) or v < 0 for v in values) or not any(values):
        raise UsageError(f"--tensor-split {text}: proportions 0 or more, not all 0, e.g. 3,1")
    return values
