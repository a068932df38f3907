"""Where a mixture of experts' stacked GGUF tensors are in the transformers model: transformers
keeps each layer's routed experts as two stacked parameters, ``mlp.experts.gate_up_proj``
(experts x 2·intermediate x hidden: the gate projection's rows, then the up projection's) and
``mlp.experts.down_proj``, where llama.cpp keeps three (``ffn_gate_exps``, ``ffn_up_exps``,
``ffn_down_exps``), the layout transformers' own GGUF loader reads them into. A recipe's tensor
is then a part of a parameter (engines/parameter_parts.py), or the whole of one (None)."""

from __future__ import annotations

import re

from kldtool.engines.parameter_parts import part_of

EXPERTS = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def expert_slots(model) -> dict[str, tuple[str, tuple | None]]:
    """GGUF tensor name -> (the parameter holding it, its part) for every stacked expert tensor."""
    out: dict[str, tuple[str, tuple | None]] = {}
    for pname, p in model.named_parameters():
        m = EXPERTS.search(pname)
        if not m or p.dim() != 3:
            continue
        layer = int(m.group(1))
        if m.group(2) == "down_proj":
            out[f"blk.{layer}.ffn_down_exps.weight"] = (pname, None)
        else:
            half = p.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = (pname, (1, 0, half))
            out[f"blk.{layer}.ffn_up_exps.weight"] = (pname, (1, half, half))
    return out


def composed(model, quant: dict, params: dict, parts: dict, tensors, device) -> dict:
    """Per parameter holding some of ``tensors``: the source's values with those tensors' parts
    as ``quant`` (a build's state dict) holds them, on ``device``."""
    out: dict = {}
    for t in tensors:
        pname, part = params[t], parts.get(t)
        if part is None:
            out[pname] = quant[pname].to(device)
            continue
        if pname not in out:
            out[pname] = model.get_parameter(pname).detach().clone()
        part_of(out[pname], part).copy_(part_of(quant[pname], part))
    return out
