"""kldtool attribute, per-layer and per-tensor errors: the built-in SmolLM2 (fp32) against its
Q2_K requant (dequantized by transformers' GGUF loader) on the first two windows of
llama-perplexity's own base file, against a float64 reference written here in plain torch: a
hybrid model with only that unit taken from the quant sees the base model's input to it (every
unit before it is the base's), so its output there against the base model's is the unit's error."""

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli
from helpers.claimed import claimed

CHUNKS = 2
pytestmark = pytest.mark.long_module


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


def _base_logprobs(path) -> np.ndarray:
    """The stored rows of the first CHUNKS windows decoded as docs/llama-perplexity-format.md says (float32 scale *
    code + min_log_prob), as float64: (chunks, rows, vocab)."""
    raw = path.read_bytes()
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(raw[8:20], dtype="<i4"))
    r, nv = n_ctx - 1 - n_ctx // 2, 2 * ((n_vocab + 1) // 2) + 4
    rows = np.frombuffer(raw, "<u2", CHUNKS * r * nv, 20 + 4 * n_chunk * n_ctx).reshape(CHUNKS, r, nv)
    scale = np.ascontiguousarray(rows[..., 0:2]).view("<f4")
    low = np.ascontiguousarray(rows[..., 2:4]).view("<f4")
    return (rows[..., 4 : 4 + n_vocab].astype(np.float32) * scale + low).astype(np.float64)


def _mean_kld(model, windows, b) -> float:
    """llama.cpp's KLD per scored token (base entries above -16 only), in float64, averaged."""
    first = windows.shape[1] // 2
    total, count = 0.0, 0
    with torch.inference_mode():
        for w, bw in zip(windows, b):
            lg = model(input_ids=torch.from_numpy(w.astype(np.int64))[None], use_cache=False).logits[0]
            logq = torch.log_softmax(lg[first : windows.shape[1] - 1].double(), -1).numpy()
            terms = np.where(bw > -16, np.exp(bw) * (bw - logq), 0.0)
            total += float(terms.sum())
            count += len(bw)
    return total / count


@contextlib.contextmanager
def _with(model, source, prefixes):
    """``model`` with the parameters under ``prefixes`` taken from ``source`` for the block."""
    theirs = dict(source.named_parameters())
    mine = {k: p for k, p in model.named_parameters() if any(k.startswith(x + ".") for x in prefixes)}
    saved = {k: p.detach().clone() for k, p in mine.items()}
    with torch.no_grad():
        for k, p in mine.items():
            p.copy_(theirs[k])
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, p in mine.items():
                p.copy_(saved[k])


def _outputs_of(model, module_names: list[str], windows: np.ndarray) -> dict[str, torch.Tensor]:
    """Each named module's outputs over the windows, from one forward per window: (tokens, width)."""
    modules = dict(model.named_modules())
    got = {name: [] for name in module_names}

    def keep(name):
        return lambda m, a, out: got[name].append(out[0] if isinstance(out, tuple) else out)

    handles = [modules[name].register_forward_hook(keep(name)) for name in module_names]
    with torch.inference_mode():
        for w in windows:
            model(input_ids=torch.from_numpy(w.astype(np.int64))[None], use_cache=False)
    for h in handles:
        h.remove()
    return {name: torch.cat([r.reshape(-1, r.shape[-1]) for r in outs]) for name, outs in got.items()}


def _reference(base, quant, names: list[str], windows) -> dict:
    """name -> the unit's errors. The base model's outputs at every unit come from one forward;
    each hybrid (only that unit from the quant) needs its own."""
    ref = _outputs_of(base, names, windows)
    errors = {}
    for name in names:
        with _with(base, quant, [name]) as hybrid:
            q = _outputs_of(hybrid, [name], windows)[name]
        y = ref[name]
        d = q - y
        cos = (q * y).sum(-1) / (q.norm(dim=-1) * y.norm(dim=-1))
        errors[name] = {
            "rel_rms": float(d.norm() / y.norm()),
            "cosine": float(cos.mean()),
            "sqnr_db": float(10 * torch.log10((y * y).sum() / (d * d).sum())),
        }
    return errors


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
        *(["--kld", "in,out", "--budget", 3] if granularity == "tensor" else ["--kld", "none"]),
        "--keep", 5, "--tensor-types", tmp_path / "types.txt", "--ignore-list", tmp_path / "ignore.txt",
        "--plot", tmp_path / "by_layer.png",
    )  # fmt: skip
    r = json.loads(out.read_text())
    units = {u["name"]: u for u in r["units"]}
    assert len(units) == (30 if granularity == "layer" else 210)  # the tied head is Q4_1 in both
    assert r["windows"] == CHUNKS and "Cost in forwards of those windows: 2 for the output errors" in p.stderr
    # stderr is a pipe here: plain lines, no redraws, no bar of transformers' GGUF loader
    assert "\r" not in p.stderr and "de-quantizing" not in p.stderr, p.stderr
    rest = [u["rel_rms"] for u in r["units"] if "out" not in u]  # after the KLD-ranked ones
    assert rest == sorted(rest, reverse=True)
    windows = _windows(fixture_base)
    for name, want in _reference(base, quant, names, windows).items():
        for key, value in want.items():
            assert units[name][key] == pytest.approx(value, rel=claimed("attribute.unit")), (name, key)
        assert units[name]["positions"] == CHUNKS * windows.shape[1]
    _check_keep_lists(r, tmp_path, sources["layer"])
    assert (tmp_path / "by_layer.png").stat().st_size > 10_000
    if granularity == "layer":
        assert all("in" not in u for u in r["units"])
        return
    # The KLD attribution of the budget's three units (the largest output errors), through
    # compare's forward and reducer, against the float64 hybrids: leave-one-in (the base with
    # only that tensor from the quant) and leave-one-out (the quant with it restored).
    b = _base_logprobs(fixture_base)
    scored = [u for u in r["units"] if "in" in u]
    assert len(scored) == 3 and r["units"][:3] == scored  # ranked first, by their gain
    assert [u["out"]["gain"] for u in scored] == sorted((u["out"]["gain"] for u in scored), reverse=True)
    with _with(base, quant, [u["name"] for u in r["units"]]) as whole_quant:
        quant_kld = _mean_kld(whole_quant, windows, b)
    assert r["references"]["quant_kld_mean"] == pytest.approx(quant_kld, rel=claimed("attribute.unit"))
    for u in scored:
        with _with(base, quant, [u["name"]]) as hybrid:
            assert u["in"]["kld_mean"] == pytest.approx(_mean_kld(hybrid, windows, b), rel=claimed("attribute.unit"))
        others = [x["name"] for x in r["units"] if x["name"] != u["name"]]
        with _with(base, quant, others) as restored:
            assert u["out"]["gain"] == pytest.approx(
                quant_kld - _mean_kld(restored, windows, b), rel=claimed("attribute.unit")
            )


def _check_keep_lists(r: dict, tmp_path, gguf_path) -> None:
    """Each --tensor-types line, as llama-quantize applies it (lowercased, regex_search over the
    GGUF's tensor names), selects exactly the GGUF tensors of its unit; the ignore list names
    the same units as llm-compressor matches modules."""
    import re

    from gguf import GGUFReader

    names = [t.name for t in GGUFReader(str(gguf_path)).tensors]
    kept = r["units"][:5]
    assert r["keep"]["units"] == [u["name"] for u in kept]
    lines = (tmp_path / "types.txt").read_text().split()
    ignore = (tmp_path / "ignore.txt").read_text().splitlines()
    assert len(lines) == len(ignore) == 5
    hf = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    hf |= {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for u, line, ign in zip(kept, lines, ignore):
        pattern, qtype = line.split("=")
        assert qtype == "q8_0"
        hits = [n for n in names if re.search(pattern.lower(), n)]
        if r["granularity"] == "layer":
            assert hits and all(n.startswith(f"blk.{u['layer']}.") for n in hits)
            assert len(hits) == sum(n.startswith(f"blk.{u['layer']}.") for n in names)
            assert re.match(ign.removeprefix("re:"), u["name"] + ".self_attn.q_proj")
        else:
            assert hits == [f"blk.{u['layer']}.{hf[u['name'].rsplit('.', 1)[1]]}.weight"]
            assert ign == u["name"]


def test_a_compressed_tensors_checkpoint_is_read_decompressed(fp32_dir, w8a8_dir, fixture_base, tmp_path):
    """llm-compressor's W8A8 SmolLM2: its int8 weights decompressed on load (the scales beside
    them are not the base's parameters and are left out), every layer a unit, and its weight
    error far below Q2_K's."""
    from safetensors.torch import load_file

    out = tmp_path / "w.json"
    run_cli("attribute", fp32_dir, w8a8_dir, "--kl-divergence-base", fixture_base, "--chunks", CHUNKS,
            "--kld", "none", "--json", out)  # fmt: skip
    r = json.loads(out.read_text())
    assert len(r["units"]) == 30 and all(0 < u["rel_rms"] < 0.05 for u in r["units"])
    packed = load_file(str(Path(w8a8_dir) / "model.safetensors"))
    assert packed["model.layers.0.mlp.down_proj.weight"].dtype == torch.int8  # stored compressed


@pytest.mark.quick
def test_bad_inputs_are_one_line(fp32_dir, fixture_base, tmp_path):
    p = run_cli("attribute", fp32_dir, fp32_dir, "--kl-divergence-base", fixture_base, check_rc=2)
    assert "equal the base model's; nothing to attribute" in p.stderr
    p = run_cli("attribute", fp32_dir, fp32_dir, check_rc=2)
    assert "needs --kl-divergence-base" in p.stderr
