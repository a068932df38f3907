"""llama.cpp's deepseek2 GGUFs (DeepSeek V2/V3, Kimi K2: latent attention) as transformers models.

transformers reads no deepseek2 GGUF, so this reads one itself: the config from the file's
metadata, every tensor dequantized by the gguf package, renamed to transformers' DeepSeek V3
parameters. llama.cpp stores each layer's ``kv_b_proj`` as two tensors, ``attn_k_b`` (per head,
transposed, so queries multiply into the latent) and ``attn_v_b``; both are written back into
their rows of ``kv_b_proj`` (``latent_slots`` says which), and the stacked experts into
transformers' stacked ``gate_up_proj`` and ``down_proj``. The rope needs no permutation: the
file keeps DeepSeek's interleaved pairs, which transformers' ``rope_interleave`` reads.
"""

from __future__ import annotations

import re

import numpy as np

from kldtool.engines.hf_gguf import gguf_arch
from kldtool.engines.parameter_parts import part_of
from kldtool.errors import EngineError

ARCH = "deepseek2"
LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
RENAMED = {  # llama.cpp's name in a layer -> transformers'
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",  # files written before the split
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}  # fmt: skip


def is_latent(path: str) -> bool:
    try:
        return gguf_arch(path)[0] == ARCH
    except (OSError, ValueError, KeyError):  # not a GGUF it can read: transformers' loader says why
        return False


def _fields(reader) -> dict:
    """The architecture's scalar keys; a float32 as the shortest decimal it stores (1e-06, not
    9.99999997e-07), which is what the checkpoint's config said."""
    from gguf import GGUFValueType

    out = {}
    for key, f in reader.fields.items():
        if key.startswith(f"{ARCH}.") and f.types and len(f.data) == 1:
            v = f.contents()
            out[key[len(ARCH) + 1 :]] = float(str(np.float32(v))) if f.types[0] == GGUFValueType.FLOAT32 else v
    return out


def latent_config(reader, vocab: int, tied: bool, layers: int):
    """transformers' DeepseekV3Config of the file's metadata, whose block count must be
    ``layers`` (the tensors'): checked first, as the config sizes lists by it."""
    from transformers import DeepseekV3Config

    k = _fields(reader)

    def need(key):
        if key not in k:
            raise EngineError(f"no {ARCH}.{key} in its metadata")
        return k[key]

    if int(need("block_count")) != layers:
        raise EngineError(f"{ARCH}.block_count is {int(need('block_count'))}, its tensors are of {layers} layers")
    rope = int(need("rope.dimension_count"))
    # key_length_mla is the decompressed head; files written before the split keep it in key_length
    qk = int(k.get("attention.key_length_mla", need("attention.key_length")))
    v = int(k.get("attention.value_length_mla", need("attention.value_length")))
    heads = int(need("attention.head_count"))
    gating = int(k.get("expert_gating_func", 1))  # gguf's ExpertGatingFuncType: 1 softmax, 2 sigmoid
    params = {"rope_type": "default", "rope_theta": float(k.get("rope.freq_base", 10000.0))}
    if k.get("rope.scaling.type") == "yarn":
        # llama.cpp's yarn_log_multiplier is 0.1 * DeepSeek's mscale_all_dim
        mscale = float(k.get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        beta = float(k.get("rope.scaling.yarn_beta_fast", 32.0)), float(k.get("rope.scaling.yarn_beta_slow", 1.0))
        params |= {"rope_type": "yarn", "factor": float(need("rope.scaling.factor")), "beta_fast": beta[0],
                   "beta_slow": beta[1], "mscale": mscale, "mscale_all_dim": mscale,
                   "original_max_position_embeddings": int(need("rope.scaling.original_context_length"))}  # fmt: skip
    elif k.get("rope.scaling.type", "none") != "none":
        raise EngineError(f"rope scaling {k['rope.scaling.type']!r} is not read here (only yarn)")
    return DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=int(need("embedding_length")),
        intermediate_size=int(need("feed_forward_length")),
        moe_intermediate_size=int(k.get("expert_feed_forward_length", 0)) or None,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        n_routed_experts=int(k.get("expert_count", 0)) or None,
        num_experts_per_tok=int(k.get("expert_used_count", 0)) or None,
        n_shared_experts=int(k.get("expert_shared_count", 0)) or None,
        first_k_dense_replace=int(k.get("leading_dense_block_count", 0)),
        routed_scaling_factor=float(k.get("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(k.get("expert_weights_norm", False)),
        scoring_func="sigmoid" if gating == 2 else "softmax",
        n_group=int(k.get("expert_group_count", 1)),
        topk_group=int(k.get("expert_group_used_count", 1)),
        q_lora_rank=int(k.get("attention.q_lora_rank", 0)) or None,
        kv_lora_rank=int(need("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=qk - rope,
        v_head_dim=v,
        head_dim=rope,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(need("context_length")),
        rope_parameters=params,
        rope_interleave=True,
        tie_word_embeddings=tied,
        bos_token_id=_token(reader, "bos"),
        eos_token_id=_token(reader, "eos"),
    )


def _token(reader, which: str):
    f = reader.fields.get(f"tokenizer.ggml.{which}_token_id")
    return None if f is None else int(f.contents())


def _values(t):
    """A GGUF tensor as float32 numpy, in the file's row-major shape (a float one copied: the
    reader maps the file read-only)."""
    from gguf.quants import dequantize

    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    return (a if a.flags.writeable else a.copy()).reshape(tuple(int(x) for x in t.shape[::-1]))


def _plan(tensors, config) -> dict[str, tuple[str, tuple | None, bool]]:
    """GGUF tensor name -> (transformers' state-dict name, the part of it the tensor fills, whether
    the tensor is that part transposed per head): a part is (dimension, start, length[, a shape
    to view the whole in first])."""
    nope, v, heads = config.qk_nope_head_dim, config.v_head_dim, config.num_attention_heads
    half = config.moe_intermediate_size
    per_head = (heads, nope + v, config.kv_lora_rank)
    parts = {"ffn_gate_exps.weight": ("mlp.experts.gate_up_proj", (1, 0, half or 0), False),
             "ffn_up_exps.weight": ("mlp.experts.gate_up_proj", (1, half or 0, half or 0), False),
             "attn_k_b.weight": ("self_attn.kv_b_proj.weight", (1, 0, nope, per_head), True),
             "attn_v_b.weight": ("self_attn.kv_b_proj.weight", (1, nope, v, per_head), False)}  # fmt: skip
    plan = {}
    for name in tensors:
        m = LAYER.match(name)
        leaf, prefix = (m.group(2), f"model.layers.{m.group(1)}.") if m else (None, "")
        if name in TOP:
            plan[name] = (TOP[name], None, False)
        elif leaf in RENAMED:
            plan[name] = (prefix + RENAMED[leaf], None, False)
        elif leaf in parts:
            hf, part, flip = parts[leaf]
            plan[name] = (prefix + hf, part, flip)
        elif name != "rope_freqs.weight":  # llama.cpp's precomputed rope factors: the config has them
            raise EngineError(f"tensor {name} has no transformers parameter here")
    return plan


def _target(whole, part: tuple | None, flip: bool):
    """What a tensor fills of ``whole``, in the tensor's own layout."""
    piece = part_of(whole, part)
    return piece.transpose(1, 2) if flip else piece


def _check(plan: dict, shapes: dict, want: dict, tied: bool) -> None:
    """Every tensor's shape is its part's, and the parts cover every entry of the state dict
    once (checked on the meta device: nothing allocated yet)."""
    covered: dict[str, int] = {}
    for name, (hf, part, flip) in plan.items():
        if hf not in want:
            raise EngineError(f"tensor {name}: the model its metadata describes has no {hf}")
        expected = tuple(_target(want[hf], part, flip).shape)
        if shapes[name] != expected:
            raise EngineError(f"tensor {name} is {shapes[name]}, its metadata makes {hf} need {expected}")
        covered[hf] = covered.get(hf, 0) + int(np.prod(expected))
    for hf, x in want.items():
        if covered.get(hf, 0) != x.numel() and not (tied and hf == "lm_head.weight"):
            raise EngineError(f"no tensor (or not all of one) for {hf}")


def load_latent(path: str, dtype):
    """The deepseek2 GGUF at ``path`` as transformers' DeepseekV3ForCausalLM in ``dtype``: the
    file's shapes checked against its metadata's model on the meta device first, then each tensor
    dequantized and copied into its place one at a time."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    reader = GGUFReader(path)
    shapes = {t.name: tuple(int(x) for x in t.shape[::-1]) for t in reader.tensors}
    try:
        if "token_embd.weight" not in shapes:
            raise EngineError("no token_embd.weight")
        layers = sorted({int(m.group(1)) for m in map(LAYER.match, shapes) if m})
        if layers != list(range(len(layers))):
            raise EngineError(f"its layers' tensors are not numbered 0 to {len(layers) - 1}")
        config = latent_config(reader, shapes["token_embd.weight"][0], "output.weight" not in shapes, len(layers))
        plan = _plan(shapes, config)
        with torch.device("meta"), no_init_weights():
            probe = AutoModelForCausalLM.from_config(config, dtype=dtype)
        _check(plan, shapes, probe.state_dict(), config.tie_word_embeddings)
    except (EngineError, ValueError, TypeError) as e:  # the config's own checks raise ValueError
        raise EngineError(f"{path}: {e}") from None
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    want = model.state_dict()
    with torch.no_grad():
        for t in reader.tensors:
            if t.name in plan:
                hf, part, flip = plan[t.name]
                _target(want[hf], part, flip).copy_(torch.from_numpy(_values(t)))
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def latent_slots(model) -> dict[str, tuple[str, tuple]]:
    """GGUF tensor name -> (kv_b_proj's parameter, its part) for each layer's attn_k_b and
    attn_v_b: kv_b_proj viewed per head, (heads, nope + v, latent), then the nope rows or the v
    rows of every head (attn_k_b is that part transposed per head)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) != "deepseek_v3":
        return {}
    names = [f"blk.{i}.attn_{w}_b.weight" for i in range(cfg.num_hidden_layers) for w in ("k", "v")]
    return {n: (hf, part) for n, (hf, part, _) in _plan(names, cfg).items()}
