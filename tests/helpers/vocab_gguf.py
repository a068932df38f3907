"""The random-weight models of vocab_models.py as F16 or F32 GGUFs written with the gguf package's writer,
in llama.cpp's tensor names and conventions for each architecture:

- llama: q/k rows moved from transformers' rotate-half layout to llama.cpp's interleaved pairs;
- qwen2: q/k/v biases, the tied head left out (llama.cpp then reads token_embd);
- qwen3: per-head q/k RMS norms;
- gemma3: four norms a layer stored as 1 + w (Gemma's RMSNorm scales by 1 + w), q/k norms,
  the embedding scaled by sqrt(hidden) in llama.cpp's graph as in transformers', a sliding window
  and per-kind rope bases, the final-logit soft-cap;
- qwen3moe: qwen3's attention, and each layer's experts stacked into one tensor per projection
  (expert, rows, columns), their router kept in float32 as llama.cpp's converter keeps it;
- deepseek2 (DeepSeek V3, Kimi K2): latent attention as llama.cpp runs it, one key-value head of
  the latent plus the rope part, with kv_b_proj split per head into k_b (transposed, so queries
  are absorbed into the latent) and v_b; the dense first layers, routed experts stacked as
  qwen3moe's, the shared expert, the routing's correction bias and sigmoid scoring. Its rope
  needs no permutation: DeepSeek's checkpoints keep llama.cpp's interleaved pairs.

Rotate-half (NEOX) rope needs no permutation: llama.cpp runs qwen2, qwen3 and gemma3 in that
layout. The vocabulary is the word-level one as a byte-level BPE whose merges build each word
"w{id}" from its prefix; llama.cpp's byte-level pre-tokenizer keeps the space before a word, so
give llama.cpp the ids (``corpus(name, ids=True)``). Quantize with `kldtool quantize`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers.vocab_models import SHAPES, SPECIALS, cache_root, model_dir

ARCH = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "qwen3_moe": "qwen3moe",
    "deepseek_v3": "deepseek2",
}
EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
LAYER = {  # transformers' name in a layer -> llama.cpp's
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# post_attention_layernorm is the pre-MLP norm of llama and qwen, Gemma's norm after attention.
GEMMA_LAYER = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
OTHER_LAYER = {"post_attention_layernorm.weight": "ffn_norm.weight"}
LATENT_LAYER = {  # DeepSeek's latent attention and shared expert; kv_b_proj is split apart
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def gguf_of(name: str, kind: str = "F16", softcap: float | None = None) -> Path:
    """The model ``name`` of vocab_models.SHAPES as an F16 (or F32) GGUF, written once and cached;
    ``softcap``: a Gemma's final-logit soft-cap replaced (a test that llama.cpp reads it)."""
    path = cache_root() / (f"{name}-{kind}.gguf" if softcap is None else f"{name}-{kind}-cap{softcap:g}.gguf")
    if path.exists():
        return path
    return write_gguf(model_dir(name), path, kind, softcap)


def write_gguf(src: Path, path: Path, kind: str = "F16", softcap: float | None = None) -> Path:
    """The transformers model directory ``src`` (one of these architectures) as a GGUF at ``path``."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((src / "config.json").read_text())
    arch, vocab = ARCH[cfg["model_type"]], cfg["vocab_size"]
    w = load_file(str(src / "model.safetensors"))
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or dim // heads
    tmp = path.with_suffix(f".partial-{os.getpid()}")
    out = gguf.GGUFWriter(str(tmp), arch)
    out.add_context_length(cfg["max_position_embeddings"])
    out.add_embedding_length(dim)
    out.add_block_count(cfg["num_hidden_layers"])
    out.add_feed_forward_length(cfg["intermediate_size"])
    out.add_head_count(heads)
    out.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    out.add_rope_freq_base(_rope_base(cfg))
    if arch == "deepseek2":
        _latent_attention(out, cfg)
    else:
        out.add_head_count_kv(kv)
        out.add_key_length(head_dim)
        out.add_value_length(head_dim)
        out.add_rope_dimension_count(head_dim)
    n_experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    if n_experts:
        out.add_expert_count(n_experts)
        out.add_expert_used_count(cfg["num_experts_per_tok"])
        out.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "gemma3":
        out.add_sliding_window(cfg["sliding_window"])
        out.add_final_logit_softcapping(softcap or cfg["final_logit_softcapping"])
    out.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if kind == "F16" else gguf.LlamaFileType.ALL_F32)
    _vocabulary(out, vocab)

    def f16(t):  # the matrices' type; norms and biases are always float32
        return t.astype(np.float16 if kind == "F16" else np.float32)

    def norm(t):  # Gemma's RMSNorm scales by 1 + w; llama.cpp's by w
        return (t + 1 if arch == "gemma3" else t).astype(np.float32)

    def rotary(t, n):  # llama only: transformers' rotate-half rows to llama.cpp's interleaved pairs
        return t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    out.add_tensor("token_embd.weight", f16(w["model.embed_tokens.weight"]))
    out.add_tensor("output_norm.weight", norm(w["model.norm.weight"]))
    if "lm_head.weight" in w or arch == "llama":  # llama.cpp's llama needs output.weight even when tied
        out.add_tensor("output.weight", f16(w.get("lm_head.weight", w["model.embed_tokens.weight"])))
    names = LAYER | (GEMMA_LAYER if arch == "gemma3" else OTHER_LAYER) | (LATENT_LAYER if arch == "deepseek2" else {})
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for hf, ours in names.items():
            if prefix + hf not in w:
                continue
            t = w[prefix + hf]
            if arch == "llama" and hf.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                t = rotary(t, heads if "q_proj" in hf else kv)
            if ours.endswith("norm.weight"):
                t = norm(t)
            out.add_tensor(f"blk.{i}.{ours}", t.astype(np.float32) if t.ndim == 1 else f16(t))
        if arch == "deepseek2":
            for ours, t in _split_kv_b(w[prefix + "self_attn.kv_b_proj.weight"], cfg).items():
                out.add_tensor(f"blk.{i}.{ours}", f16(t))
        if prefix + "mlp.gate.weight" in w:  # a mixture's layer (DeepSeek's first ones are dense)
            out.add_tensor(f"blk.{i}.ffn_gate_inp.weight", w[prefix + "mlp.gate.weight"].astype(np.float32))
            for hf, ours in EXPERTS.items():
                stacked = np.stack([w[f"{prefix}mlp.experts.{e}.{hf}.weight"] for e in range(n_experts)])
                out.add_tensor(f"blk.{i}.{ours}.weight", f16(stacked))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    os.replace(tmp, path)
    return path


def _latent_attention(out, cfg: dict) -> None:
    """llama.cpp's deepseek2 keys: attention as one key-value head of the latent and the rope
    part (values: the latent), with the per-head sizes it decompresses to; the dense lead layers;
    the routing's shared expert, sigmoid scores, renormalised and scaled weights."""
    import gguf

    rope, latent = cfg["qk_rope_head_dim"], cfg["kv_lora_rank"]
    out.add_head_count_kv(1)
    out.add_key_length(latent + rope)
    out.add_value_length(latent)
    out.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    out.add_value_length_mla(cfg["v_head_dim"])
    out.add_rope_dimension_count(rope)
    out.add_q_lora_rank(cfg["q_lora_rank"])
    out.add_kv_lora_rank(latent)
    out.add_vocab_size(cfg["vocab_size"])
    out.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    out.add_expert_shared_count(cfg["n_shared_experts"])
    out.add_expert_weights_scale(cfg["routed_scaling_factor"])
    out.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
    gating = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID, "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
    out.add_expert_gating_func(gating[cfg["scoring_func"]])
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn":  # as llama.cpp's converter writes DeepSeek's yarn
        out.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        out.add_rope_scaling_factor(rope["factor"])
        out.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        out.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _split_kv_b(t, cfg: dict) -> dict:
    """kv_b_proj (heads x (nope + v), latent) as llama.cpp's attn_k_b (heads, latent, nope), which
    multiplies the queries into the latent, and attn_v_b (heads, v, latent)."""
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    per_head = t.reshape(cfg["num_attention_heads"], nope + v, t.shape[-1])
    return {"attn_k_b.weight": per_head[:, :nope].swapaxes(1, 2).copy(), "attn_v_b.weight": per_head[:, nope:].copy()}


def _rope_base(cfg: dict) -> float:
    """The rope base of the model's full-attention layers (Gemma's sliding ones use 10,000 in
    both transformers and llama.cpp)."""
    params = cfg.get("rope_parameters") or {}
    params = params.get("full_attention", params)
    return float(params.get("rope_theta", cfg.get("rope_theta") or 10_000.0))


def _vocabulary(out, vocab: int) -> None:
    import gguf

    tokens = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), vocab)]
    out.add_tokenizer_model("gpt2")
    out.add_tokenizer_pre("default")
    out.add_token_list(tokens)
    out.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (vocab - len(SPECIALS)))
    # "w1" and "w2" are no tokens (ids 1 and 2 are <s> and </s>) but lead to "w10".."w29999":
    # llama.cpp merges through symbols that are not in the vocabulary.
    out.add_token_merges(["w 1", "w 2"] + [f"{t[:-1]} {t[-1]}" for t in tokens[len(SPECIALS) :]])
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_add_bos_token(False)


if __name__ == "__main__":
    import sys

    for n in sys.argv[1:] or SHAPES:
        print(n, gguf_of(n))
