"""Wider clamp windows (``base --clamp C``): codes against float64 log-probs, the KLD over
the wider window against a float64 numpy computation, the container's metadata, the CLI's
refusals, and a self-compare of the real SmolLM2 through a 24-nat file."""

import json

import numpy as np
import pytest
import torch

from conftest import WIKI, run_cli
from kldtool.codec import CODE_MAX, decode_np, encode_np, rows_to_torch
from kldtool.errors import MetadataError
from kldtool.logitsfile import create_writer, open_base_file
from kldtool.logitsfile.header import BaseHeader
from kldtool.reduce import reduce_rows

pytestmark = pytest.mark.quick


def heavy_tail_case(clamp, n=16, v=20000):
    """Rows whose tail sits 16 to clamp + 3 nats below the top, and a quant that pushes that
    tail far down: a divergence a 16-nat window cannot see."""
    rng = np.random.default_rng(int(clamp))
    base = rng.uniform(-clamp - 3, -16.5, (n, v))
    base[:, :8] = rng.uniform(-3, 0, (n, 8))
    quant = base + 0.2 * rng.standard_normal((n, v))
    quant[:, 8:] -= 90
    return base.astype(np.float32), quant.astype(np.float32), rng.integers(0, v, n)


def log_softmax64(x):
    x = x.astype(np.float64)
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def kld64(base, quant, floor):
    """KL(base‖quant) over the base entries above ``floor`` (llama.cpp's rule with -16)."""
    lp, lq = log_softmax64(base), log_softmax64(quant)
    return np.where(lp > floor, np.exp(lp) * (lp - lq), 0).sum(1)


@pytest.mark.parametrize("codec", ["grid", "llamacpp"])
@pytest.mark.parametrize("clamp", [24.0, 32.0])
def test_wider_window_codes_and_kld_match_float64(codec, clamp):
    base, quant, targets = heavy_tail_case(clamp)
    rows, _ = encode_np(base, codec, clamp)
    lp = log_softmax64(base)
    b = decode_np(rows, base.shape[1]).astype(np.float64)
    scale = rows[:, :2].copy().view(np.float32)[:, 0].astype(np.float64)
    if codec == "grid":
        assert (scale == 2.0**-11).all()  # 65535 steps of 2^-12 would span only 16 nats
    else:
        assert np.allclose(scale * CODE_MAX, clamp, rtol=1e-6)
    inside = lp > lp.max(1, keepdims=True) - clamp + scale[:, None]
    assert inside[:, 8:].mean() > 0.4  # much of the tail is stored, not clamped
    assert (np.abs(b - lp) <= scale[:, None] / 2 + 2e-6)[inside].all()

    got = reduce_rows(torch.from_numpy(quant), rows_to_torch(rows), targets, clamped_at=-clamp).kld
    want, narrow = kld64(base, quant, -clamp), kld64(base, quant, -16.0)
    # codes move each log p by at most scale / 2, so each term p (log p - log q) by at most
    # p (scale / 2) (1 + |log p - log q|) to first order (base rows are not renormalised)
    lq = log_softmax64(quant)
    rounding = scale / 2 * np.where(lp > -clamp, np.exp(lp) * (1 + np.abs(lp - lq)), 0).sum(1)
    print(
        f"max |error| {np.abs(got - want).max():.2e}, rounding bound {rounding.min():.2e}..{rounding.max():.2e}, "
        f"16..{clamp:g} nats add {(want - narrow).min():.2e}..{(want - narrow).max():.2e}"
    )
    assert (np.abs(got - want) <= 1.01 * rounding + 1e-7).all()
    # the window matters here: what the 16-nat floor drops is far above the rounding
    assert (want - narrow > 5 * rounding).all()


def test_container_records_the_window_and_refuses_bad_ones(fixture_base, tmp_path):
    r = open_base_file(fixture_base)
    h = BaseHeader(n_ctx=r.header.n_ctx, n_vocab=r.header.n_vocab, n_chunk=1)
    tokens, rows = r.tokens[: h.n_tokens], r.read_chunk(0)
    r.close()

    def container(name, header, metadata=None):
        w = create_writer(tmp_path / name, "kldtool", header, tokens, metadata)
        w.write_chunk(rows)
        w.finish()
        return tmp_path / name

    wide = open_base_file(container("wide.kldt", BaseHeader(n_ctx=h.n_ctx, n_vocab=h.n_vocab, n_chunk=1, clamp=24.0)))
    assert wide.header.clamp == 24.0 and wide.header.clamped_at == -24.0 and wide.metadata["clamp"] == 24.0
    wide.close()
    assert open_base_file(container("plain.kldt", h)).header.clamp == 16.0
    for bad in ("24", 8, 100, True):
        with pytest.raises(MetadataError, match="metadata clamp"):
            open_base_file(container(f"bad-{bad}.kldt", h, {"clamp": bad}))
    # llama.cpp's layout has no place for the window: converting a wider file is refused
    p = run_cli("convert", tmp_path / "wide.kldt", tmp_path / "wide.kld", check_rc=None)
    assert p.returncode == 2 and "16-nat clamp window only" in p.stderr and not (tmp_path / "wide.kld").exists()


def test_cli_refuses_windows_it_cannot_store(tmp_path):
    p = run_cli(
        "base", "--clamp", "24", "--format", "llamacpp", "--kl-divergence-base", tmp_path / "x.kld", check_rc=None
    )
    assert p.returncode == 2 and "16-nat clamp window only" in p.stderr and not (tmp_path / "x.kld").exists()
    p = run_cli("base", "--clamp", "8", "--kl-divergence-base", tmp_path / "y.kldt", check_rc=None)
    assert p.returncode == 2 and "outside 16..64" in p.stderr and not (tmp_path / "y.kldt").exists()


# WikiText-2's rare tokens lie more than 16 nats down often enough to move PPL(base) by 0.1 %;
# the stand-in text of a clone without shared/ has too few of them to show it.
@pytest.mark.needs_shared
@pytest.mark.full_tier
def test_smollm2_through_a_24_nat_file(tmp_path, q4_1_gguf, requant):
    """The real model against itself through a 24-nat file: the divergence stays at rounding
    level (a floor or step out of step with the file would show). Against Q4_K_M: PPL(base)
    from the 24-nat file is the base run's own (from its logits), where a 16-nat file caps the
    NLL of targets more than 16 nats down; the KLD moves by the entries 16..24 nats down."""
    wide, narrow = tmp_path / "wide.kldt", tmp_path / "narrow.kldt"
    common = ("base", "-m", q4_1_gguf, "-f", WIKI, "-c", 128, "--chunks", 3)
    run_cli(*common, "--clamp", 24, "--kl-divergence-base", wide, "--json", tmp_path / "base.json")
    run_cli(*common, "--kl-divergence-base", narrow)
    exact_ppl = json.loads((tmp_path / "base.json").read_text())["ppl"]
    info = json.loads(run_cli("info", wide, "--json").stdout)
    assert info["clamp_nats"] == 24.0 and info["metadata"]["clamp"] == 24.0
    stats = {}
    for name, base, model in (
        ("self", wide, q4_1_gguf),
        ("wide", wide, requant("Q4_K_M")),
        ("narrow", narrow, requant("Q4_K_M")),
    ):
        run_cli("compare", "--kl-divergence-base", base, "-m", model, "--json", tmp_path / f"{name}.json")
        stats[name] = json.loads((tmp_path / f"{name}.json").read_text())["statistics"]
    print({k: (v["ppl_base"]["value"], v["kld_mean"]["value"]) for k, v in stats.items()}, exact_ppl)
    assert stats["self"]["kld_mean"]["value"] < 1e-5
    w, n = stats["wide"], stats["narrow"]
    assert w["ppl_q"]["value"] == pytest.approx(n["ppl_q"]["value"], rel=1e-6)
    assert w["ppl_base"]["value"] == pytest.approx(exact_ppl, rel=1e-4)
    assert n["ppl_base"]["value"] < exact_ppl * (1 - 1e-3)
    assert w["kld_mean"]["value"] == pytest.approx(n["kld_mean"]["value"], rel=0.05)
