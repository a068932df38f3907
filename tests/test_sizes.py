"""Size accounting against independent counts: the transformers model's own nn.Linear layers,
the GGUF block layouts as ggml defines them, and safetensors' own reader."""

import os

import pytest

from kldtool.provenance.sizes import model_size

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def layer_counts(fp32_dir):
    """(decoder linear weights, embedding weights) of SmolLM2, counted by torch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fp32_dir, dtype=torch.float32)
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    embed = model.get_input_embeddings().weight.numel()
    assert model.config.tie_word_embeddings  # the head is the embedding: counted once
    return linear, embed


def test_gguf_q4_1(q4_1_gguf, layer_counts):
    s = model_size(str(q4_1_gguf))
    assert (s.linear_params, s.embed_head_params) == layer_counts
    # ggml Q4_1: a block of 32 weights is two fp16 (scale, min) and 16 bytes of nibbles = 5 bits/weight.
    assert s.bpw_linear == 5.0
    # SmolLM2's Q4_1 GGUF keeps its embeddings in Q8_0: 32 int8 and one fp16 scale per block.
    assert s.embed_head_bytes == s.embed_head_params // 32 * 34
    assert s.file_bytes == os.path.getsize(q4_1_gguf)
    assert s.file_bytes > s.linear_bytes + s.embed_head_bytes


@pytest.mark.full_tier  # builds the W8A8 checkpoint on a new machine (llm-compressor: a minute or more)
def test_safetensors_fp32_and_w8a8(fp32_dir, w8a8_dir, layer_counts):
    from safetensors import safe_open

    f32 = model_size(fp32_dir)
    assert (f32.linear_params, f32.embed_head_params) == layer_counts
    assert f32.bpw_linear == f32.bpw_total == 32.0

    q = model_size(w8a8_dir)
    assert (q.linear_params, q.embed_head_params) == layer_counts
    rows = 0
    with safe_open(os.path.join(w8a8_dir, "model.safetensors"), "pt") as f:
        for name in f.keys():
            if name.endswith("_proj.weight"):
                rows += f.get_slice(name).get_shape()[0]
    # int8 weights plus one float32 scale per output row; the embeddings stay float32.
    assert q.linear_bytes == layer_counts[0] + 4 * rows
    assert q.embed_head_bytes == 4 * layer_counts[1]


def test_what_is_not_a_model(tmp_path):
    assert model_size(str(tmp_path)) is None
    assert model_size("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    from kldtool.errors import UsageError

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(UsageError, match="junk.gguf: not a readable GGUF"):
        model_size(str(junk))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(UsageError, match="model.safetensors: not a safetensors file"):
        model_size(str(tmp_path))


@pytest.mark.full_tier
def test_gguf_tensor_table_matches_the_gguf_packages_reader(q4_1_gguf, tmp_path):
    """The header walk against gguf's own (slow, full) reader: same tensors, elements, bytes."""
    import gguf

    from kldtool.provenance.sizes import _gguf_tensors

    ref = [(t.name, int(t.n_elements), int(t.n_bytes)) for t in gguf.GGUFReader(str(q4_1_gguf), "r").tensors]
    assert _gguf_tensors(str(q4_1_gguf)) == ref
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(q4_1_gguf.read_bytes()[: 1 << 20])  # inside the vocabulary's strings
    from kldtool.errors import UsageError

    with pytest.raises(UsageError, match="cut.gguf: not a readable GGUF"):
        _gguf_tensors(str(cut))


def test_ggml_block_table_matches_the_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES

    from kldtool.provenance.sizes import _GGML_BLOCKS, _ggml_block

    for t, blocks in _GGML_BLOCKS.items():
        assert blocks == GGML_QUANT_SIZES[t], t
    assert _ggml_block(23) == GGML_QUANT_SIZES[23]  # IQ4_XS: not in the table, from gguf
