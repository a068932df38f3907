"""Compact (top-K) base files: the records against the full rows they come from, the reducer
against a float64 numpy computation of the one-bucket definitions, and the whole path
(base --keep, info, compare) on the real SmolLM2 beside a full base file of the same run."""

import json

import numpy as np
import pytest
import torch

from conftest import WIKI, run_cli
from kldtool.codec import Coding, decode_np, encode_np
from kldtool.reduce import CLAMPED_AT
from kldtool.reduce.topk_rows import reduce_topk_rows
from kldtool.codec.topk_records import encode_topk_torch, rest_np, split_records, topk_width
from kldtool.logitsfile import open_base_file

pytestmark = pytest.mark.quick


def case(seed, n=64, v=500, spread=2.0, noise=0.3):
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal((n, v)) * spread).astype(np.float32)
    quant = (base + noise * rng.standard_normal((n, v))).astype(np.float32)
    return base, quant, rng.integers(0, v, n)


def reference(base, quant, targets, k):
    """The one-bucket KLD and the stored parts, from float64 logits and the full rows' codes."""
    full, _ = encode_np(base, "llamacpp")
    b = decode_np(full, base.shape[1]).astype(np.float64)
    codes = full[:, 4 : 4 + base.shape[1]].astype(np.int64)
    x = base.astype(np.float64)
    p_exact = np.exp(x - x.max(1, keepdims=True))
    p_exact /= p_exact.sum(1, keepdims=True)
    y = quant.astype(np.float64)
    logq = y - y.max(1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(1, keepdims=True))
    out = {"kld": [], "ids": [], "rest": [], "full_kld": np.where(b > -16, np.exp(b) * (b - logq), 0).sum(1)}
    out["full_tv"] = 0.5 * np.abs(np.where(b > -16, np.exp(b), 0) - np.exp(logq)).sum(1)
    out["full_same"] = (np.where(b > -16, np.exp(b), 0) * np.exp(logq)).sum(1)
    out["same"] = []
    for r in range(len(base)):
        ids = np.lexsort((np.arange(base.shape[1]), -codes[r]))[:k]  # by code, lower id first
        rest_p = p_exact[r].sum() - p_exact[r, ids].sum()
        rest_q = 1 - np.exp(logq[r, ids]).sum()
        head = np.where(b[r, ids] > -16, np.exp(b[r, ids]) * (b[r, ids] - logq[r, ids]), 0).sum()
        out["kld"].append(head + rest_p * np.log(rest_p / rest_q))
        out["ids"].append(ids)
        out["rest"].append(rest_p)
        out["same"].append((np.where(b[r, ids] > -16, np.exp(b[r, ids]), 0) * np.exp(logq[r, ids])).sum())
    return full, {k_: np.array(v) for k_, v in out.items()}


@pytest.mark.parametrize("seed,k", [(0, 16), (1, 64), (2, 10)])
def test_records_and_reducer_match_float64_reference(seed, k):
    base, quant, targets = case(seed)
    full, ref = reference(base, quant, targets, k)
    records, _ = encode_topk_torch(torch.from_numpy(base), targets, Coding("llamacpp", keep=k))
    assert records.shape == (len(base), topk_width(k))
    scale, low, rest, tcode, ids, codes = split_records(records, k)
    assert np.array_equal(ids.numpy(), ref["ids"])
    # the very codes (and code parameters) of the full row, and the target's code whatever its rank
    assert np.array_equal(codes.numpy(), np.take_along_axis(full[:, 4:].astype(np.int64), ref["ids"], 1))
    assert np.array_equal(tcode.numpy(), full[np.arange(len(base)), 4 + targets])
    assert np.array_equal(scale.numpy(), full[:, :2].copy().view(np.float32)[:, 0])
    assert np.allclose(rest.numpy(), ref["rest"], rtol=1e-6, atol=1e-12)

    got = reduce_topk_rows(torch.from_numpy(quant), records, targets, k, CLAMPED_AT)
    assert np.allclose(got.kld, ref["kld"], rtol=2e-5, atol=2e-6)
    # one bucket can only lower the divergence (log-sum inequality)
    assert (got.kld <= ref["full_kld"] + 2e-6).all()
    assert (got.kld_tail >= 0).all()
    q64 = quant.astype(np.float64)  # the compared rows are whole: their top-1 probability is exact
    np.testing.assert_allclose(got.ptop_q, np.exp(q64.max(1) - np.logaddexp.reduce(q64, axis=1)), rtol=1e-6)
    # the total variation of the whole rows in its interval, up to the decoding of the tail's
    # codes (the stored rest mass is the exact one; measured within 3e-5)
    assert (got.tv <= ref["full_tv"] + 1e-4).all() and (ref["full_tv"] <= got.tv_hi + 1e-4).all()
    assert (got.tv_hi > got.tv).all() and np.allclose(got.p_out, ref["rest"], rtol=1e-6, atol=1e-12)
    # Σ p·q over the stored entries: the float64 sum over those ids, below the whole rows' value
    assert np.allclose(got.same_sample, ref["same"], rtol=1e-5, atol=1e-8)
    assert (got.same_sample <= ref["full_same"] + 1e-6).all()


@pytest.mark.full_tier
def test_topk_and_full_base_files_of_one_run(tmp_path, requant):
    """The same base run stored whole and as top-64: identical PPL, Δp and top agreement; a
    smaller KLD (the lower bound); the full KLD within the reported interval."""
    full, top = tmp_path / "full.kld", tmp_path / "top.kldt"
    common = ("base", "-f", WIKI, "-c", 128, "--chunks", 3, "--codec", "llamacpp")
    run_cli(*common, "--format", "llamacpp", "--kl-divergence-base", full)
    run_cli(*common, "--keep", "top-64", "--kl-divergence-base", top)
    info = json.loads(run_cli("info", top, "--json").stdout)
    assert info["keep"] == 64 and info["ratio_to_raw"] < 0.02
    stats = {}
    for name, path in (("full", full), ("top", top)):
        run_cli("compare", "--kl-divergence-base", path, "-m", requant("Q4_K_M"), "--json", tmp_path / f"{name}.json")
        stats[name] = json.loads((tmp_path / f"{name}.json").read_text())["statistics"]
    f, t = stats["full"], stats["top"]
    for key in ("ppl_q", "ppl_base", "dp_mean", "same_top_p"):
        assert t[key]["value"] == pytest.approx(f[key]["value"], rel=1e-6), key
    c = t["compact_base"]
    assert c["keep"] == 64 and c["kld_mean_lower_bound"] == t["kld_mean"]["value"]
    assert c["kld_mean_lower_bound"] < f["kld_mean"]["value"] <= c["kld_mean_lower_bound"] + c["bound"]
    assert "compact_base" not in f
    tv_full, tv_top = f["extra"]["tv"], t["extra"]["tv"]
    assert tv_full["exact"] and not tv_top["exact"]
    assert tv_top["mean"]["value"] <= tv_full["mean"]["value"] <= tv_top["mean_upper"]
    # The full file made top-64 afterwards (convert --keep; what pack does) holds the run's own
    # records: ids, codes, row parameters and target codes bit for bit; the rest mass is read
    # from the stored codes (clamped entries count 0, as the full file's reader counts them),
    # so it sits below the run's own by at most the clamped entries' mass, each under e^-16.
    run_cli("convert", full, tmp_path / "conv.kldt", "--keep", "top-64")
    made, ran = (open_base_file(str(tmp_path / n)) for n in ("conv.kldt", "top.kldt"))
    assert made.header == ran.header and (made.tokens == ran.tokens).all()
    for c in range(ran.header.n_chunk):
        a, b = made.read_chunk(c), ran.read_chunk(c)
        assert (np.delete(a, [4, 5], axis=1) == np.delete(b, [4, 5], axis=1)).all()
        assert (rest_np(a) <= rest_np(b) * (1 + 1e-4) + 1e-7).all()
        assert (rest_np(b) - rest_np(a) <= ran.header.n_vocab * np.exp(ran.header.clamped_at)).all()


def test_topk_needs_the_container_and_a_sane_k(tmp_path):
    p = run_cli(
        "base", "--keep", "top-64", "--format", "llamacpp", "--kl-divergence-base", tmp_path / "x.kld", check_rc=None
    )
    assert p.returncode == 2 and "full rows only" in p.stderr and not (tmp_path / "x.kld").exists()
    p = run_cli("base", "--keep", "top-3", "--kl-divergence-base", tmp_path / "y.kldt", check_rc=None)
    assert p.returncode == 2 and "K >= 10" in p.stderr
