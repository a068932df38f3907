"""Tiny random-weight mixtures of experts for the routing tests: Qwen 3 MoE (softmax routing,
chosen weights renormalised) and DeepSeek V3 (a dense first layer, sigmoid routing with a
correction bias, a shared expert: Kimi K2's layout), four layers each and a 512-word vocabulary,
so a base run and a compare take seconds; and copies whose experts in one layer (not its
router) are perturbed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

VOCAB = 512
LAYERS = 4
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, max_position_embeddings=4096)
SHAPES = {
    "qwen3-moe": (
        "qwen3_moe",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2)
        | dict(moe_intermediate_size=64, norm_topk_prob=True),
    ),
    "deepseek-v3": (
        "deepseek_v3",
        dict(num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1)
        | dict(num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1, n_group=1, topk_group=1)
        | dict(q_lora_rank=32, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16)
        | dict(head_dim=16, topk_method="noaux_tc", scoring_func="sigmoid", routed_scaling_factor=2.5),
    ),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build(name: str, target: Path, **sizes) -> Path:
    """The shape ``name`` at ``target``; ``sizes`` overrides COMMON's and the shape's own
    (docs/metrics.md's figure uses 8 layers of 256)."""
    import torch
    from helpers.vocab_models import tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, special = SHAPES[name]
    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, **(COMMON | special | sizes)
    )
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if hasattr(model.model.layers[-1].mlp.gate, "e_score_correction_bias"):
        # A bias that changes the choice, as a trained model's does (zero at initialisation).
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(torch.randn(gate.e_score_correction_bias.shape) * 0.01)
    model.save_pretrained(target)
    tokenizer(VOCAB).save_pretrained(target)
    return target


def perturbed_experts(src: Path, target: Path, layer: int, std: float = 0.02) -> Path:
    """A copy of ``src`` with noise added to layer ``layer``'s routed experts only."""
    return perturbed(src, target, {(layer, "experts"): std})


def perturbed(src: Path, target: Path, noise: dict) -> Path:
    """A copy of ``src`` with noise of standard deviation ``noise[(layer, part)]`` added to each
    part named: "experts" (all of the layer's routed experts), "expert E" (one of them), "router"
    or "shared" (the shared expert)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    g = torch.Generator().manual_seed(sum(layer for layer, _ in noise))
    with torch.no_grad():
        for (layer, part), std in noise.items():
            mlp = model.model.layers[layer].mlp
            module = {"router": mlp.gate, "shared": getattr(mlp, "shared_experts", None)}.get(part, mlp.experts)
            for p in module.parameters():
                piece = p[int(part.split()[1])] if part.startswith("expert ") else p
                piece.add_(torch.randn(piece.shape, generator=g) * std)
    model.save_pretrained(target)
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, target / f)
    return target


def corpus(path: Path, words: int = 20_000, ids: bool = False) -> Path:
    """The words "w{id}" (transformers' word-level tokenizer maps them back to the ids), or with
    ``ids`` the ids themselves (--corpus-format ids: llama.cpp's byte-level one reads them otherwise)."""
    drawn = np.random.default_rng(0).integers(3, VOCAB, words)
    word = "{}" if ids else "w{}"
    path.write_text("\n".join(" ".join(word.format(i) for i in drawn[k : k + 50]) for k in range(0, words, 50)) + "\n")
    return path
