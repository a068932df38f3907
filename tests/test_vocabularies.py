"""Every vocabulary users quantize, end to end through transformers: random-weight models of the
real architectures (Llama 3 at 128,256, Qwen 2 at 151,936 with tied embeddings, Qwen 3 at Qwen
3.5's 248,320, Gemma 3 at 262,144 with soft-capping, Qwen 3's mixture of experts at 151,936 and
DeepSeek V3's at Kimi K2's 163,840; tests/helpers/vocab_models.py) over a corpus whose ids run
past 65,535. Each model against itself, its first window against a float64 forward computed
here, and at the largest vocabulary every stored form (raw layout, container, top-K, hidden
states), convert, ppl and shards merged; at every vocabulary the stored forms' bytes in process;
llama.cpp from GGUFs written here for every architecture. vLLM at every vocabulary:
test_vllm_engine.py."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from conftest import compare_json, run_cli
from helpers.float64_forward import first_window_nll, log_softmax
from helpers.vocab_gguf import ARCH, gguf_of
from helpers.vocab_models import SHAPES, corpus, corpus_flags, model_dir

CTX = 64


def base_of(name: str, path, *args, chunks: int = 2):
    m = model_dir(name)
    run_cli("base", "-m", m, *corpus_flags(name), "-c", CTX, "--chunks", chunks, "--kl-divergence-base", path, *args)
    return m


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_model_against_itself_and_a_float64_forward(name, vocab_base, tmp_path):
    base, model = vocab_base(name), model_dir(name)  # base_of(name, ...), written once per run
    r = compare_json(base, tmp_path, "-m", model, "--per-token", tmp_path / "t.h5")
    s = r["statistics"]
    print(name, SHAPES[name][1], s["kld_mean"], s["same_top_p"])
    assert r["base_file"]["n_vocab"] == SHAPES[name][1]
    # PPL(base) is read from the stored rows: each target's log-prob rounded to the 2^-12-nat grid,
    # an error uniform within half a step, whose mean over 62 tokens has a spread of 9e-6.
    assert abs(s["kld_mean"]["value"]) < 1e-6 and abs(s["ln_ppl_ratio"]["value"]) < 5e-5
    # Near-uniform predictions: the uint16 codes' step decides a few near-ties of the top.
    assert s["same_top_p"]["value"] > 0.98
    with h5py.File(tmp_path / "t.h5") as f:
        first = f["chunk"][:] == 0
        targets, nll = f["target"][:], f["nll_q"][:]
    assert targets.max() > 65_535 and (targets > 65_535).mean() > 0.4
    np.testing.assert_allclose(nll[first], first_window_nll(model, base), atol=1e-4)


def test_the_largest_vocabulary_in_every_stored_form(tmp_path):
    name = "gemma3"
    raw, container = tmp_path / "raw.kld", tmp_path / "converted.kldt"
    model = base_of(name, raw, "--format", "llamacpp")
    # llama.cpp's layout: a row is the vocabulary's uint16 codes plus two float32 (scale, min).
    n_rows = 2 * (CTX - 1 - CTX // 2)
    tokens = 2 * CTX
    assert raw.stat().st_size == 20 + 4 * tokens + n_rows * (2 * SHAPES[name][1] + 8)
    run_cli("convert", raw, container)
    whole = compare_json(raw, tmp_path, "-m", model)["statistics"]
    assert compare_json(container, tmp_path, "-m", model)["statistics"] == whole
    for form in (("--keep", 32), ("--store", "hidden")):
        other = tmp_path / f"{form[1]}.kldt"
        base_of(name, other, *form)
        s = compare_json(other, tmp_path, "-m", model)["statistics"]
        assert abs(s["kld_mean"]["value"]) < 1e-6, form
    facts = json.loads(run_cli("info", "--json", tmp_path / "hidden.kldt").stdout)
    assert facts["replay_floor_kld_mean"] < 1e-7  # Gemma's soft-cap, replayed from the hidden states
    # Shards of the raw file merge into the whole run.
    for k in (0, 1):
        compare_json(raw, tmp_path, "-m", model, "--chunk-range", f"{k}:{k + 1}", "--state", tmp_path / f"s{k}.npz")
    merged = tmp_path / "merged.json"
    run_cli("merge", tmp_path / "s0.npz", tmp_path / "s1.npz", "--json", merged)
    assert json.loads(merged.read_text())["statistics"]["kld_mean"] == whole["kld_mean"]
    ppl = run_cli("ppl", "-m", model, *corpus_flags(name), "-c", CTX, "--chunks", 2).stderr
    assert "Final estimate: PPL = " in ppl


@pytest.mark.parametrize("vocab", sorted({v for _, v, _ in SHAPES.values()}))
@pytest.mark.quick
def test_every_stored_form_at_every_vocabulary(vocab, tmp_path):
    """The rows of one run stored in every form at each vocabulary, in process (no model): what
    each file reads back is what the encoder made, the raw layout's row is 2 * V + 8 bytes, the
    container's frames cut mid-chunk join up, a top-K record keeps the K best codes with ties
    to the lower id, and the codes decode to a float64 log-softmax within half a step."""
    import torch

    from kldtool.codec import Coding
    from kldtool.codec.encode import encode_base_rows
    from kldtool.codec.topk_records import split_records
    from kldtool.logitsfile import BaseHeader, create_writer, open_base_file

    ctx = 16  # 7 scored rows a chunk: the frames of 3 rows below cut each chunk twice
    rng = np.random.default_rng(vocab)
    n_chunk, per_chunk = 2, ctx - 1 - ctx // 2
    tokens = rng.integers(0, vocab, n_chunk * ctx).astype(np.int32)
    tokens[::3] = rng.integers(65_536, vocab, len(tokens[::3]))  # ids past uint16
    logits = (rng.standard_normal((n_chunk * per_chunk, vocab)) * 3).astype(np.float32)
    # ties for the top: the same logit at an id below 65,536 and at one above
    logits[:, vocab - 7] = logits[:, 11] = logits.max(axis=1) + 1
    targets = np.concatenate([tokens[c * ctx + ctx // 2 + 1 : (c + 1) * ctx] for c in range(n_chunk)])
    rows, nll = encode_base_rows(torch.from_numpy(logits), targets, Coding("llamacpp"))

    logp = log_softmax(logits)
    np.testing.assert_allclose(nll, -logp[np.arange(len(targets)), targets], rtol=1e-6, atol=1e-5)
    head = rows[:, :4].copy().view(np.float32)
    decoded = rows[:, 4 : 4 + vocab].astype(np.float64) * head[:, :1] + head[:, 1:2]
    live = logp > -16 + head[:, :1]  # above the clamp window's floor
    assert np.all(np.abs(decoded - logp)[live] <= 0.5 * np.broadcast_to(head[:, :1], logp.shape)[live] + 1e-5)

    def store(name, fmt, stored_rows, keep=None, frame_rows=None):
        """``stored_rows`` written chunk by chunk as ``name``, and the file opened again."""
        w = create_writer(
            tmp_path / name,
            fmt,
            BaseHeader(n_ctx=ctx, n_vocab=vocab, n_chunk=n_chunk, keep=keep),
            tokens,
            frame_rows=frame_rows,
        )
        for part in np.split(stored_rows, n_chunk):
            w.write_chunk(part)
        w.finish()
        r = open_base_file(tmp_path / name)
        assert r.header.n_vocab == vocab and np.array_equal(r.tokens, tokens)
        assert np.array_equal(np.concatenate([r.read_chunk(c) for c in range(n_chunk)]), stored_rows)
        return r

    stored = {
        name: store(name, fmt, rows, frame_rows=frame_rows)
        for name, fmt, frame_rows in (
            ("raw.kld", "llamacpp", None),
            ("one.kldt", "kldtool", None),
            ("cut.kldt", "kldtool", 3),
        )
    }
    for r in stored.values():
        assert np.array_equal(r.read_rows(1, 2, 6), rows[per_chunk + 2 : per_chunk + 6])
    assert (tmp_path / "raw.kld").stat().st_size == 20 + 4 * len(tokens) + len(rows) * (2 * vocab + 8)
    assert stored["cut.kldt"].frames.n_frames > n_chunk

    k = 32
    records, _ = encode_base_rows(torch.from_numpy(logits), targets, Coding("llamacpp", keep=k))
    top = store("top.kldt", "kldtool", records, keep=k)
    _, _, _, tcode, ids, codes = split_records(torch.from_numpy(records.view(np.int16)), k)
    full = rows[:, 4 : 4 + vocab].astype(np.int64)
    order = np.argsort(-full, axis=1, kind="stable")[:, :k]  # by code, lower id first
    assert np.array_equal(ids.numpy(), order) and (order[:, 0] == 11).all() and (order[:, 1] == vocab - 7).all()
    assert np.array_equal(codes.numpy(), np.take_along_axis(full, order, 1))
    assert np.array_equal(tcode.numpy(), full[np.arange(len(targets)), targets])
    for r in (*stored.values(), top):
        r.close()


@pytest.mark.parametrize("name", [n for n in SHAPES if SHAPES[n][0] in ARCH])
def test_llama_cpp_at_every_vocabulary_and_its_quants_in_order(name, vocab_base, tmp_path):
    """Each shape as a GGUF in llama.cpp's conventions for its architecture
    (helpers/vocab_gguf.py), against transformers' float32 base file: F32 is the same model, its
    first window's NLL that of a float64 forward; F16, then Q8_0 and Q4_K_M from llama.cpp's
    quantize, in order of KLD. At 128,256 a base file llama.cpp writes in its own layout reads
    back through transformers; at 262,144 llama.cpp applies Gemma's soft-cap."""
    model, gguf = model_dir(name), gguf_of(name)
    ids = ("-f", corpus(name, ids=True), "--corpus-format", "ids", "-c", CTX, "--chunks", 2)
    base = vocab_base(name)  # transformers' of the same windows (its text corpus reads as these ids)
    # llama.cpp's defaults (flash attention, an f16 KV cache) keep parts of attention in f16,
    # ~2.7e-4 nats of NLL: the float64 check runs without them.
    f32 = ("-m", gguf_of(name, "F32"), "--flash-attn", "off", "--kv-cache-dtype", "f32")
    f32 += ("--per-token", tmp_path / "f32.h5")
    s = compare_json(base, tmp_path, *f32)["statistics"]
    assert abs(s["kld_mean"]["value"]) < 1e-6 and s["same_top_p"]["value"] > 0.98
    with h5py.File(tmp_path / "f32.h5") as f:
        first = f["chunk"][:] == 0
        nll = f["nll_q"][:][first]
    # Gemma's GELU is the one activation ggml's CPU backend takes from an f16 table (GGML_GELU_FP16
    # in ggml-cpu/vec.h): 2.5e-4 nats there, under 1e-4 for the SiLU architectures.
    np.testing.assert_allclose(nll, first_window_nll(model, base), atol=3e-4 if name == "gemma3" else 1e-4)
    klds = []
    for t in ("F16", "Q8_0", "Q4_K_M"):
        q = gguf if t == "F16" else tmp_path / f"{t}.gguf"
        if t != "F16":
            run_cli("quantize", gguf, q, t)
        s = compare_json(base, tmp_path, "-m", q)["statistics"]
        print(f"llama.cpp {name} {t} at {SHAPES[name][1]:,}:", s["kld_mean"], s["same_top_p"])
        klds.append(s["kld_mean"]["value"])
    assert abs(klds[0]) < 1e-5 and klds[0] < klds[1] < klds[2] and klds[2] > 10 * klds[1]
    if name == "llama3":
        raw = tmp_path / "llamacpp.kld"
        run_cli("base", "-m", gguf, *ids, "--format", "llamacpp", "--kl-divergence-base", raw)
        back = compare_json(raw, tmp_path, "-m", model)["statistics"]
        assert abs(back["kld_mean"]["value"]) < 1e-5 and back["same_top_p"]["value"] > 0.97
    if name == "gemma3":  # the same weights capped at 0.05: llama.cpp reads the cap
        capped = compare_json(base, tmp_path, "-m", gguf_of(name, softcap=0.05))["statistics"]
        assert capped["kld_mean"]["value"] > 0.01


def test_a_tied_head_replayed_from_hidden_states(tmp_path):
    hidden = tmp_path / "hidden.kldt"
    model = base_of("qwen2", hidden, "--store", "hidden")
    facts = json.loads(run_cli("info", "--json", hidden).stdout)
    assert facts["replay_floor_kld_mean"] < 1e-7 and facts["hidden"] == "256 x float32"
    assert abs(compare_json(hidden, tmp_path, "-m", model)["statistics"]["kld_mean"]["value"]) < 1e-6


@pytest.mark.quick
def test_a_block_is_encoded_in_slices_with_the_same_bytes(monkeypatch):
    """The base encoder takes a block's rows a slice at a time (its temporaries are a few times
    its input: 5 GiB beside a 1,023-row block of a 262,144 vocabulary). Rows are independent, so
    slices of 3 rows give what one call gives, for every coding."""
    import torch

    from kldtool.codec import encode
    from kldtool.codec.rows import Coding

    logits = torch.randn(10, 262_144, generator=torch.Generator().manual_seed(0)) * 3
    targets = np.random.default_rng(0).integers(0, 262_144, 10)
    for coding in (Coding(), Coding(codec="llamacpp"), Coding(keep=32)):
        whole = encode.encode_base_rows(logits, targets, coding)
        monkeypatch.setattr(encode, "ENCODE_BYTES", 3 * 4 * 262_144)
        sliced = encode.encode_base_rows(logits, targets, coding)
        monkeypatch.undo()
        assert np.array_equal(whole[0], sliced[0]) and np.array_equal(whole[1], sliced[1]), coding
