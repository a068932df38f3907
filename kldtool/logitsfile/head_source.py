"""Where an output head comes from when a hidden-state file does not carry it (``base --head
external``): the base model itself, named in the file with the head's sha256, read back at
compare time without loading the whole model.

- a GGUF file: its ``output.weight`` (or tied ``token_embd.weight``) as llama.cpp applies it;
- a transformers checkpoint directory: the model is built on the meta device (no weights), the
  parameter its output embeddings hold is named there, and only that tensor is read from the
  safetensors files, in the dtype the base run used.

The head is then hashed as the file would have stored it; a different hash is an error, never
a silently different base.
"""

from __future__ import annotations

import json
from pathlib import Path

from kldtool.provenance import model_ref
from kldtool.errors import EngineError


def head_transforms(config) -> tuple[float | None, float | None]:
    """(multiplier, soft-cap) a transformers config applies to its logits: Cohere's
    ``logit_scale`` multiplies them, Granite's ``logits_scaling`` divides them, Gemma's
    ``final_logit_softcapping`` bounds them."""
    text = getattr(config, "get_text_config", lambda: config)()
    scale, scaling = getattr(text, "logit_scale", None), getattr(text, "logits_scaling", None)
    multiplier = scale if scale not in (None, 1.0) else (1.0 / scaling if scaling not in (None, 1.0) else None)
    return multiplier, getattr(text, "final_logit_softcapping", None)


def load_head(source: str, meta: dict):
    """The OutputHead of the model at ``source`` in the form ``meta`` (the file's "head") names."""
    from kldtool.logitsfile import ggml_head
    from kldtool.logitsfile.hidden import OutputHead

    path = Path(model_ref.local_path(source))
    if not path.exists():
        raise EngineError(
            f"{source}: the base model that holds this file's output head is not there "
            f"(--head-from PATH names where it is now)"
        )
    if ggml_head.is_ggml(meta["dtype"]):
        if path.suffix != ".gguf":
            raise EngineError(f"{source}: the file's head is a GGUF tensor ({meta['dtype']}); this is not a GGUF file")
        h = ggml_head.gguf_head(str(path))
        return OutputHead(
            weight=h["data"],
            bias=None,
            multiplier=h["multiplier"],
            softcap=h["softcap"],
            ggml=h["type"],
            shape=h["shape"],
        )
    if not path.is_dir():
        raise EngineError(
            f"{source}: the file's head ({meta['dtype']}) comes from a transformers checkpoint "
            f"directory; this is not one"
        )
    return _checkpoint_head(path, meta["dtype"])


def _checkpoint_head(path: Path, dtype: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kldtool.logitsfile.hidden import OutputHead

    try:
        config = AutoConfig.from_pretrained(str(path))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as e:
        raise EngineError(f"{path}: transformers cannot build this model: {str(e).splitlines()[0]}") from None
    lm = model.get_output_embeddings()
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is lm.weight]
    bias_names = [n for n, p in model.named_parameters(remove_duplicate=False) if lm.bias is not None and p is lm.bias]
    files = _safetensors_files(path)
    weight = _read_tensor(files, names, path)
    bias = _read_tensor(files, bias_names, path) if bias_names else None
    cast = getattr(torch, dtype)
    multiplier, softcap = head_transforms(config)
    return OutputHead(
        weight=weight.to(cast), bias=None if bias is None else bias.to(cast), multiplier=multiplier, softcap=softcap
    )


def _safetensors_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    found = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            found.update({k: f for k in st.keys()})
    if not found:
        raise EngineError(f"{path}: no safetensors weights to read the output head from")
    return found


def _read_tensor(files: dict, names: list[str], path: Path):
    from safetensors import safe_open

    for name in names:
        if name in files:
            with safe_open(str(files[name]), "pt") as st:
                return st.get_tensor(name)
    raise EngineError(f"{path}: none of {', '.join(names)} is in its safetensors files")
