"""kldtool attribute, per-layer and per-tensor errors: the built-in SmolLM2 (fp32) against its
Q2_K requant (dequantized by transformers' GGUF loader) on the first two windows of
llama-perplexity's own base file, against a float64 reference written here in plain torch: a
hybrid model with only that unit taken from the quant sees the base model's input to it (every
unit before it is the base's), so its output there against the base model's is the unit's error."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli

CHUNKS = 2


@pytest.fixture(scope="module")
def models(fp32_dir, requant):
    from transformers import AutoModelForCausalLM

    q2 = requant("Q2_K")
    base = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float64).eval()
    quant = AutoModelForCausalLM.from_pretrained(str(q2.parent), gguf_file=q2.name, dtype=torch.float64).eval()
    # The same weights as a checkpoint directory: the tensor run reads the quant from one (and
    # skips a second dequantization), the layer run from the GGUF.
    as_dir = q2.parent / "q2_k-dequantized"
    if not (as_dir / "model.safetensors").exists():
        plain = AutoModelForCausalLM.from_config(base.config, dtype=torch.float64)  # not marked GGUF
        plain.load_state_dict(quant.state_dict())
        plain.save_pretrained(as_dir)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(fp32_dir) / f, as_dir / f)
    return base, quant, {"layer": q2, "tensor": as_dir}


def _windows(path) -> np.ndarray:
    """llama.cpp's header: magic, n_ctx, n_vocab, n_chunk (int32), then the chunks' tokens."""
    raw = path.read_bytes()
    n_ctx, _, n_chunk = np.frombuffer(raw[8:20], dtype="<i4")
    return np.frombuffer(raw[20 : 20 + 4 * n_ctx * n_chunk], dtype="<i4").reshape(n_chunk, n_ctx)[:CHUNKS]


def _output_of(model, module_name: str, windows: np.ndarray) -> list[torch.Tensor]:
    module = dict(model.named_modules())[module_name]
    got = []
    handle = module.register_forward_hook(lambda m, a, out: got.append(out[0] if isinstance(out, tuple) else out))
    with torch.inference_mode():
        for w in windows:
            model(input_ids=torch.from_numpy(w.astype(np.int64))[None], use_cache=False)
    handle.remove()
    return got


def _reference(base, quant, name: str, windows) -> dict:
    hybrid_state = dict(base.state_dict())
    qstate = quant.state_dict()
    for k in hybrid_state:
        if k.startswith(name + "."):
            hybrid_state[k] = qstate[k]
    ref = _output_of(base, name, windows)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    base.load_state_dict(hybrid_state)
    try:
        got = _output_of(base, name, windows)
    finally:
        base.load_state_dict(base_state)
    y = torch.cat([r.reshape(-1, r.shape[-1]) for r in ref])
    q = torch.cat([g.reshape(-1, g.shape[-1]) for g in got])
    d = q - y
    cos = (q * y).sum(-1) / (q.norm(dim=-1) * y.norm(dim=-1))
    return {
        "rel_rms": float(d.norm() / y.norm()),
        "cosine": float(cos.mean()),
        "sqnr_db": float(10 * torch.log10((y * y).sum() / (d * d).sum())),
    }


@pytest.mark.parametrize(
    "granularity,names",
    [
        ("layer", ["model.layers.0", "model.layers.15", "model.layers.29"]),
        (
            "tensor",
            ["model.layers.0.self_attn.q_proj", "model.layers.12.self_attn.v_proj", "model.layers.29.mlp.down_proj"],
        ),
    ],
)
def test_unit_errors_equal_a_float64_reference(models, fp32_dir, fixture_base, tmp_path, granularity, names):
    base, quant, sources = models
    out = tmp_path / "a.json"
    p = run_cli(
        "attribute", fp32_dir, sources[granularity], "--kl-divergence-base", fixture_base, "--chunks", CHUNKS,
        "--granularity", granularity, "--dtype", "float64", "--json", out,
    )  # fmt: skip
    r = json.loads(out.read_text())
    units = {u["name"]: u for u in r["units"]}
    assert len(units) == (30 if granularity == "layer" else 210)  # the tied head is Q4_1 in both
    assert r["windows"] == CHUNKS and "cost: 2 forwards" in p.stderr
    assert [u["rel_rms"] for u in r["units"]] == sorted((u["rel_rms"] for u in r["units"]), reverse=True)
    windows = _windows(fixture_base)
    for name in names:
        want = _reference(base, quant, name, windows)
        for key, value in want.items():
            assert units[name][key] == pytest.approx(value, rel=1e-6), (name, key)
        assert units[name]["positions"] == CHUNKS * windows.shape[1]


def test_bad_inputs_are_one_line(fp32_dir, fixture_base, tmp_path):
    p = run_cli("attribute", fp32_dir, fp32_dir, "--kl-divergence-base", fixture_base, check_rc=2)
    assert "equal the base model's; nothing to attribute" in p.stderr
    p = run_cli("attribute", fp32_dir, fp32_dir, check_rc=2)
    assert "needs --kl-divergence-base" in p.stderr
