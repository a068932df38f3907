"""Long windows through llama.cpp and transformers, at 16k-32k tokens on a random-weight Llama 3
shape (rope base 500,000; tests/helpers/vocab_models.py's llama3-32k, its F16 GGUF written in
llama.cpp's conventions): the checkpoint's base against its own F16 GGUF under flash attention
at every depth bucket, and llama.cpp's KV-cache types against its f16-cache base. The 128k runs
are benchmarks (benchmarks/long_window_memory.py --phase llamacpp)."""

import json

import pytest

from conftest import run_cli
from helpers.vocab_gguf import gguf_of
from helpers.vocab_models import corpus, model_dir
from helpers.claimed import claimed

NAME = "llama3-32k"
LONG = 16_384
SHORT = 4_096  # the cache types the order claim does not rank run at a quarter of the length
KV_TYPES = ("f32", "bf16", "q8_0", "q5_1", "q5_0", "iq4_nl", "q4_1", "q4_0")
RANKED = ("f16", "f32", "q8_0", "q5_1", "q4_0")  # at 16k: the f16 base's own, and the order of bits


def _compare(base, tmp_path, name: str, *flags, length: int = LONG) -> dict:
    out = tmp_path / f"{name}.json"
    p = run_cli("compare", "--kl-divergence-base", base, "--json", out, *flags)
    # A window this long returns freed buffers to the system (the heap's holes add up).
    if length == LONG:
        assert f"note: windows of {LONG} tokens: freed buffers go back to the system" in p.stderr
    return json.loads(out.read_text())["statistics"]


@pytest.fixture(scope="module")
def long_bases(tmp_path_factory):
    """The checkpoint's base (transformers, exl3: every position of one 16k window scored) and the
    F16 GGUF's own (llama.cpp, flash attention on, f16 cache: its scored half)."""
    d = tmp_path_factory.mktemp("long")
    ids = ("-f", corpus(NAME, ids=True), "--corpus-format", "ids", "--chunks", 1)
    ckpt = d / "checkpoint.kldt"
    run_cli("base", "-m", model_dir(NAME), *ids, "--protocol", "exl3", "-c", LONG, "--stride", LONG,
            "--kl-divergence-base", ckpt)  # fmt: skip
    own = d / "f16-cache.kldt"
    run_cli("base", "-m", gguf_of(NAME), *ids, "-c", LONG, "--flash-attn", "on", "--kl-divergence-base", own)
    short = d / "f16-cache-4k.kldt"
    run_cli("base", "-m", gguf_of(NAME), *ids, "-c", SHORT, "--flash-attn", "on", "--kl-divergence-base", short)
    return d, ckpt, own, short


def test_f16_gguf_matches_its_checkpoint_at_every_depth(long_bases, tmp_path):
    _, ckpt, _, _ = long_bases
    s = _compare(ckpt, tmp_path, "f16", "-m", gguf_of(NAME), "--flash-attn", "on")
    rows = s["depth"]["rows"]
    assert [r["bucket"] for r in rows][-1] == f"{LONG // 2}-{LONG - 1}" and len(rows) == 14
    assert sum(r["tokens"] for r in rows) == s["count"] == LONG - 1
    assert max(abs(r["kld_mean"]) for r in rows) < claimed("long.f16_depth_kld")
    assert s["same_top_p"]["value"] > 0.99


def test_kv_cache_types_against_the_f16_cache_base(long_bases, tmp_path):
    """Every cache type llama.cpp offers for K and V runs under flash attention: at 16k the f16
    cache reproduces its own base to the rows' rounding, f32 equals it, and the quantized caches
    diverge in order of their bits (q8_0 < q5_1 < q4_0); the other types run at 4k against a
    4k base of the f16 cache (each 16k run costs as much as the four of them)."""
    _, _, own, short = long_bases
    kld = {}
    for kv in ("f16", *KV_TYPES):
        at = (own, LONG) if kv in RANKED else (short, SHORT)
        s = _compare(
            at[0], tmp_path, kv, "-m", gguf_of(NAME), "--flash-attn", "on", "--kv-cache-dtype", kv, length=at[1]
        )
        kld[kv] = s["kld_mean"]["value"]
        assert sum(r["tokens"] for r in s["depth"]["rows"]) == s["count"] == at[1] // 2 - 1
        assert 0 <= kld[kv] < 0.5 or kv in RANKED  # a cache type that runs gives a KLD, not a breakdown
    print({k: f"{v:.3g}" for k, v in kld.items()})
    # The f16 cache differs from its base only by the base rows' rounding (~1e-8 here).
    assert abs(kld["f16"]) < 1e-7 and abs(kld["f32"] - kld["f16"]) < 1e-8
    assert kld["f16"] < kld["q8_0"] < kld["q5_1"] < kld["q4_0"]
    # Two caches of one GGUF are two configurations: report ranks them and draws their depth curves.
    table = tmp_path / "kv.md"
    run_cli("report", tmp_path / "q8_0.json", tmp_path / "q4_0.json", "--markdown", table, "--plots", tmp_path / "p")
    assert "q8_0" in table.read_text() and "q4_0" in table.read_text()
    assert (tmp_path / "p" / "kld_by_depth.png").stat().st_size > 10_000


def test_quantized_v_cache_without_flash_attention_is_refused(long_bases):
    _, _, own, _ = long_bases
    p = run_cli("compare", "--kl-divergence-base", own, "-m", gguf_of(NAME), "--flash-attn", "off",
                "--kv-cache-dtype", "q4_0", check_rc=None)  # fmt: skip
    assert p.returncode != 0 and "--kv-cache-dtype q4_0" in p.stderr and "--flash-attn" in p.stderr


@pytest.mark.quick
def test_a_quantized_v_cache_without_flash_attention_is_refused_before_any_work(fixture_base, q4_1_gguf, tmp_path):
    """The same refusal on the built-in model: one line, before a window is scored, no file."""
    out = tmp_path / "r.json"
    p = run_cli("compare", "--kl-divergence-base", fixture_base, "-m", q4_1_gguf, "--flash-attn", "off",
                "--kv-cache-dtype", "q4_0", "--json", out, check_rc=None)  # fmt: skip
    assert p.returncode != 0 and "--kv-cache-dtype q4_0" in p.stderr and "--flash-attn" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()
