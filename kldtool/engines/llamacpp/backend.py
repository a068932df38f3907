"""Which of llama.cpp's backends computed a run's logits, as libggml lists its devices: the CPU
(with the build's instruction sets) or the GPUs that hold the offloaded layers (CUDA, Metal,
Vulkan, ROCm), how many layers they hold and how they are split. The name goes in the run's
first line, its JSON's ``model`` block and its manifest: llama.cpp's kernels differ per backend,
so a base file and a compare made on different ones differ by that too."""

from __future__ import annotations

import ctypes
import re
import sys
from dataclasses import dataclass

from kldtool.engines.llamacpp.offload import Offload
from kldtool.errors import UsageError

GPU_TYPES = (1, 2)  # ggml-backend.h's GGML_BACKEND_DEVICE_TYPE_GPU and _IGPU
KINDS = {"MTL": "Metal", "ROCm": "ROCm", "CUDA": "CUDA", "Vulkan": "Vulkan"}
_warned = False


@dataclass(frozen=True)
class Device:
    name: str  # ggml's ("CUDA0", "Vulkan1", "MTL0", "CPU")
    description: str  # the hardware's ("NVIDIA H200")
    gpu: bool

    @property
    def kind(self) -> str:
        stem = re.sub(r"\d+$", "", self.name)
        return KINDS.get(stem, stem)


def devices(lib) -> list[Device]:
    """libggml's devices, in its order (the GPUs' order is -mg's and -ts's)."""
    import llama_cpp.llama_cpp as raw

    ggml = raw._lib  # libllama's handle also finds the symbols of libggml, which it links
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for f in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, f).restype = ctypes.c_char_p
        getattr(ggml, f).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    out = []
    for i in range(int(ggml.ggml_backend_dev_count())):
        dev = ggml.ggml_backend_dev_get(i)
        text = (ggml.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace")
        desc = (ggml.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
        out.append(Device(text, desc, int(ggml.ggml_backend_dev_type(dev)) in GPU_TYPES))
    return out


def offload_gpus(lib) -> list[Device]:
    """The GPUs this llama.cpp build can offload to (none on a build without offload)."""
    return [d for d in devices(lib) if d.gpu] if lib.llama_supports_gpu_offload() else []


@dataclass(kw_only=True, frozen=True)
class Placement:
    gpus: tuple[Device, ...]  # the GPUs holding layers (none: the CPU computes everything)
    layers: int  # layers on them
    n_layers: int  # layers llama.cpp can offload (the model's, plus its output layer)
    offload: Offload
    cpu_isa: str

    @property
    def on_gpu(self) -> bool:
        return self.layers > 0

    @property
    def name(self) -> str:
        """The backend as the manifest compares it: "CPU", or "CUDA: NVIDIA H200 (31/31 layers)"
        (and where the KV cache stays on the CPU, so)."""
        if not self.on_gpu:
            return "CPU"
        kinds = sorted({d.kind for d in self.gpus})
        where = ", ".join(d.description or d.name for d in self.gpus)
        split = f", split {self.offload.split_mode}" if len(self.gpus) > 1 else ""
        kv = ", KV cache on the CPU" if not self.offload.kv_offload else ""
        return f"{'/'.join(kinds)}: {where} ({self.layers}/{self.n_layers} layers{split}{kv})"

    def line(self) -> str:
        """For the run's first line."""
        return f", {self.name}" if self.on_gpu else f", CPU ({self.cpu_isa})"

    def describe(self) -> dict:
        return {
            "device": self.gpus[0].kind.lower() if self.on_gpu else "cpu",
            "backend": self.name,
            "devices": [f"{d.name}: {d.description}" for d in self.gpus],
            "offloaded_layers": f"{self.layers}/{self.n_layers}",
            **self.offload.describe(),
        }


def check_devices(lib, offload: Offload) -> None:
    """Refuse, before anything loads, a GPU index or split that names more GPUs than llama.cpp
    sees (a build without GPUs sees none, and ignores both, as llama-perplexity does)."""
    gpus = offload_gpus(lib)
    if not gpus:
        return
    if offload.main_gpu >= len(gpus):
        raise UsageError(f"--main-gpu {offload.main_gpu}: llama.cpp sees {len(gpus)} GPU(s), numbered from 0")
    if len(offload.tensor_split) > len(gpus):
        raise UsageError(
            f"--tensor-split {','.join(f'{p:g}' for p in offload.tensor_split)}: {len(offload.tensor_split)} "
            f"proportions, llama.cpp sees {len(gpus)} GPU(s)"
        )


def placement(lib, model, offload: Offload, cpu_isa: str) -> Placement:
    """Where ``model``, loaded with ``offload``'s settings, runs. On a build that cannot offload,
    a flag asking for a GPU gets one warning (once a process) and the run goes on on the CPU."""
    n_layers = int(lib.llama_model_n_layer(model)) + 1  # llama.cpp counts the output layer too
    gpus = offload_gpus(lib)
    if not gpus:
        _warn_once(offload)
        return Placement(gpus=(), layers=0, n_layers=n_layers, offload=offload, cpu_isa=cpu_isa)
    if offload.split_mode == "none":
        used = gpus[offload.main_gpu : offload.main_gpu + 1]
    elif offload.tensor_split:
        used = [g for g, p in zip(gpus, offload.tensor_split) if p > 0]
    else:
        used = gpus
    layers = n_layers if offload.n_gpu_layers < 0 else min(offload.n_gpu_layers, n_layers)
    return Placement(
        gpus=tuple(used), layers=layers if used else 0, n_layers=n_layers, offload=offload, cpu_isa=cpu_isa
    )


def _warn_once(offload: Offload) -> None:
    global _warned
    if offload.asks_for_gpu and not _warned:
        _warned = True
        print(
            "warning: this llama.cpp build has no GPU to offload to: --n-gpu-layers, --split-mode, --main-gpu, "
            "--tensor-split and --no-kv-offload change nothing, and it runs on the CPU",
            file=sys.stderr,
        )
