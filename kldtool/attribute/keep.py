"""The top units of an attribution as the lists quantizers read: llama-quantize ``--tensor-type``
lines (GGUF tensor names as regular expressions, ``=TYPE``) and an llm-compressor ``ignore``
list (module names; a whole layer as an ``re:`` pattern).

GGUF names follow llama.cpp's for Llama-style models (``blk.N.attn_q.weight`` ...); a module
with no known GGUF name is left out of the GGUF list and reported. A mixture's router and shared
expert have theirs; one routed expert has none (llama.cpp stacks a layer's experts into one
tensor, quantized at one type), so ``--granularity expert`` lists experts for llm-compressor only.
"""

from __future__ import annotations

import re

GGUF_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
EXPERT_TENSORS = {  # a mixture's units with a GGUF tensor of their own (attribute/expert_units.py)
    "gate": r"^blk\.{layer}\.ffn_gate_inp\.weight$",
    "router": r"^blk\.{layer}\.ffn_gate_inp\.weight$",
    "shared_experts": r"^blk\.{layer}\.ffn_(gate|up|down)_shexp\.weight$",
    "shared_expert": r"^blk\.{layer}\.ffn_(gate|up|down)_shexp\.weight$",
}
ROUTER_NAMES = (".gate", ".router")


def gguf_pattern(row: dict, granularity: str) -> str | None:
    """The regular expression llama-quantize matches the unit's GGUF tensors with."""
    if row["name"] in ("lm_head", "model.lm_head"):
        return r"^output\.weight$"
    if row["layer"] is None:
        return None
    if granularity == "layer":
        return rf"^blk\.{row['layer']}\."
    if granularity == "expert":
        return EXPERT_TENSORS.get(row["name"].rsplit(".", 1)[-1], "").format(layer=row["layer"]) or None
    suffix = row["name"].split(f".{row['layer']}.", 1)[-1]
    tensor = GGUF_TENSORS.get(suffix)
    return rf"^blk\.{row['layer']}\.{tensor}\.weight$" if tensor else None


def tensor_type_lines(rows: list[dict], granularity: str, qtype: str) -> tuple[list[str], list[str]]:
    """(``PATTERN=TYPE`` lines, names with no GGUF tensor)."""
    lines, missing = [], []
    for r in rows:
        p = gguf_pattern(r, granularity)
        if p is None:
            missing.append(r["name"])
        else:
            lines.append(f"{p}={qtype}")
    return lines, missing


def ignore_lines(rows: list[dict], granularity: str) -> list[str]:
    if granularity == "expert":  # an expert and a shared expert are modules of their own in a checkpoint
        return [r["name"] if r["name"].endswith(ROUTER_NAMES) else f"re:^{re.escape(r['name'])}\\." for r in rows]
    if granularity == "layer":
        return [f"re:^{re.escape(r['name'])}\\." for r in rows]
    return [r["name"] for r in rows]


def keep_lists(result: dict, n: int, qtype: str) -> dict:
    """The top ``n`` ranked units and their two lists (added to the result as ``keep``)."""
    rows = result["units"][:n]
    lines, missing = tensor_type_lines(rows, result["granularity"], qtype)
    return {
        "units": [r["name"] for r in rows],
        "type": qtype,
        "tensor_type_lines": lines,
        "no_gguf_name": missing,
        "ignore": ignore_lines(rows, result["granularity"]),
    }
