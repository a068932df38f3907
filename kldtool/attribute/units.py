"""The parts of a model a quant can be blamed on: each decoder layer (``layer``), each linear
tensor inside one (``tensor``), or in a mixture of experts each expert of each layer, each
layer's router and its shared expert (``expert``: expert_units.py), with the quant's values of
the parameters it owns.

Both models are transformers models of one architecture (a GGUF is dequantized by transformers'
own loader, which also maps llama.cpp's tensor names and layouts back); a unit is kept only where
some parameter of it differs. The quant's values stay on the CPU until a unit is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

from kldtool.errors import MismatchError, UsageError

GRANULARITIES = ("layer", "tensor", "expert")


@dataclass(kw_only=True)
class Unit:
    name: str  # the module's path in the base model, e.g. model.layers.3.self_attn.q_proj
    layer: int | None  # the decoder layer it is in
    module: object  # the base model's module
    quant: dict  # parameter name (relative to the module) -> the quant's tensor
    base: dict  # the same parameters' base values (leave-one-out restores them)
    numel: int  # parameters the quant changes
    part: int | None = None  # one expert: the index along the first axis of the module's parameters

    def full(self, values: dict) -> dict:
        """``values`` as whole parameters of the module (an expert's slice set into the others'
        current values), for a call of the module with them."""
        if self.part is None:
            return values
        params = dict(self.module.named_parameters())
        out = {}
        for k, v in values.items():
            whole = params[k].detach().clone()
            whole[self.part] = v.to(whole.device)
            out[k] = whole
        return out


def decoder_layer_owner(model) -> tuple[object, str]:
    """(the module holding a transformers causal LM's decoder layers, its attribute naming them):
    ``model.model`` and ``layers``, and their kin."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        *parents, last = path.split(".")
        obj = model
        for part in parents:
            obj = getattr(obj, part, None)
        if obj is not None and getattr(obj, last, None) is not None:
            return obj, last
    raise UsageError(f"attribute: {type(model).__name__} has no decoder layers kldtool knows how to find")


def decoder_layers(model) -> list:
    """The decoder layers of a transformers causal LM (``model.model.layers`` and its kin)."""
    owner, name = decoder_layer_owner(model)
    return list(getattr(owner, name))


def _layer_index(name: str, layers: dict) -> int | None:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        hit = layers.get(".".join(parts[:k]))
        if hit is not None:
            return hit
    return None


def find_units(base, quant, granularity: str) -> list[Unit]:
    import torch

    if granularity not in GRANULARITIES:
        raise UsageError(f"--granularity {granularity!r}: expected one of {', '.join(GRANULARITIES)}")
    qstate = quant.state_dict()
    bstate = base.state_dict()
    # A compressed checkpoint keeps its scales and zero points beside the decompressed weights:
    # only the base's own parameters are compared.
    if not set(bstate) <= set(qstate):
        odd = sorted(set(bstate) - set(qstate))[:3]
        raise MismatchError(f"attribute: the quant has no {', '.join(odd)} ... (not the base's architecture)")
    names = {m: n for n, m in base.named_modules()}
    layers = {names[m]: i for i, m in enumerate(decoder_layers(base))}
    if granularity == "expert":
        raise UsageError("--granularity expert: attribute/expert_units.py finds those units")
    if granularity == "layer":
        owners = [(names[m], m) for m in decoder_layers(base)]
    else:
        owners = [(n, m) for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
    units = []
    for name, module in owners:
        changed, original = {}, {}
        for pname, p in module.named_parameters():
            full = f"{name}.{pname}"
            q = qstate[full]
            if q.shape != p.shape:
                raise MismatchError(f"attribute: {full} is {tuple(q.shape)} in the quant, {tuple(p.shape)} in the base")
            if not torch.equal(q.to(p.dtype), p.detach().cpu()):
                changed[pname] = q.detach().to("cpu", p.dtype)
                original[pname] = p.detach().clone()
        if changed:
            n = sum(t.numel() for t in changed.values())
            units.append(
                Unit(name=name, layer=_layer_index(name, layers), module=module, quant=changed, base=original, numel=n)
            )
    if not units:
        raise UsageError("attribute: the quant's weights equal the base model's; nothing to attribute")
    return units


def load_quant(path: str, dtype: str):
    """The quant as a transformers model with float weights: a GGUF dequantized by transformers'
    loader, a compressed-tensors (llm-compressor) checkpoint decompressed on load, any other
    checkpoint directory as it is."""
    import json
    import os

    import torch
    from transformers import AutoModelForCausalLM

    from kldtool.engines.hf_gguf import gguf_loading
    from kldtool.errors import EngineError

    kwargs = {"dtype": getattr(torch, dtype)}
    source = path
    gguf = path.lower().endswith(".gguf")
    if gguf:
        source, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    else:
        try:
            with open(os.path.join(path, "config.json")) as f:
                method = (json.load(f).get("quantization_config") or {}).get("quant_method")
        except (OSError, ValueError) as e:
            raise EngineError(f"{path}: no readable config.json ({e})") from None
        if method == "compressed-tensors":
            from transformers.utils.quantization_config import CompressedTensorsConfig

            kwargs["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    try:
        with gguf_loading():  # one parse of the file for the check below and the loader
            if gguf:
                from kldtool.engines.latent_gguf import is_latent, load_latent

                if is_latent(path):  # transformers reads no deepseek2 GGUF
                    return load_latent(path, kwargs["dtype"])
            return AutoModelForCausalLM.from_pretrained(source, **kwargs).eval()
    except (OSError, ValueError) as e:
        raise EngineError(f"{path}: transformers could not load it: {str(e).splitlines()[0]}") from None
