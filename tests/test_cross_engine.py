"""A base written by transformers (fp32 SmolLM2), compared by llama.cpp and by transformers."""

import pytest

from conftest import compare_json as _stats


def test_llamacpp_q4_1_against_transformers_f32_base(hf_base, q4_1_gguf, tmp_path):
    r = _stats(hf_base, tmp_path, "-m", q4_1_gguf)
    s = r["statistics"]
    print("mean KLD", s["kld_mean"], "same top", s["same_top_p"])
    assert r["model"]["engine"] == "llamacpp" and r["base_file"]["metadata"]["model"]["engine"] == "transformers"
    assert r["tokenizer_identity"]["model"] == r["tokenizer_identity"]["base"]
    assert 0 <= s["kld_mean"]["value"] < 0.01
    assert s["same_top_p"]["value"] > 0.95


@pytest.mark.quick
def test_transformers_against_its_own_base(hf_base, tmp_path):
    s = _stats(hf_base, tmp_path, "--engine", "transformers")["statistics"]
    assert abs(s["kld_mean"]["value"]) < 1e-4
    assert s["same_top_p"]["value"] == 1.0


def test_json_has_the_run_metadata(hf_base, q4_1_gguf, tmp_path):
    r = _stats(hf_base, tmp_path, "-m", q4_1_gguf)
    for key in (
        "protocol",
        "n_ctx",
        "chunks",
        "scored_tokens",
        "model",
        "base_file",
        "tokenizer_identity",
        "wall_time_s",
        "kldtool_version",
    ):
        assert key in r
    assert r["protocol"]["name"] == "llamacpp" and r["n_ctx"] == 128 and r["scored_tokens"] == 8 * 63
    assert "llama-cpp-python" in r["model"]["versions"]
    for stat in (
        "ppl_q",
        "ppl_base",
        "ln_ppl_ratio",
        "ppl_ratio",
        "ppl_diff",
        "kld_mean",
        "dp_mean",
        "rms_dp",
        "same_top_p",
    ):
        assert set(r["statistics"][stat]) == {"value", "uncertainty"}
    assert set(r["statistics"]["kld_quantiles"]) >= {"max", "99.9%", "median", "0.1%", "min"}


def test_transformers_on_the_gguf_is_the_model_it_dequantizes_to(hf_base, q4_1_gguf, tmp_path):
    """transformers' GGUF loader (inside kldtool.engines.hf_gguf's gguf_loading) on the
    built-in Q4_1 file gives the weights of the fp32 checkpoint that the base file came from:
    the same statistics, to the bit, as that checkpoint's own run."""
    run = ("--engine", "transformers", "--dtype", "float32", "--chunks", 2)
    on_gguf = _stats(hf_base, tmp_path, *run, "-m", q4_1_gguf)
    on_dir = _stats(hf_base, tmp_path, *run)
    assert on_gguf["model"]["engine"] == "transformers" and on_gguf["scored_tokens"] == 2 * 63
    assert on_gguf["statistics"] == on_dir["statistics"]
    assert on_gguf["statistics"]["same_top_p"]["value"] == 1.0
