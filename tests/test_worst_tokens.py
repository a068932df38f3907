"""``kldtool worst``: the positions and windows with the largest divergence, against numpy
rankings of the per-token file and the base rows llama-perplexity itself wrote (the fixture)."""

import json

import h5py
import numpy as np
import pytest

from conftest import run_cli
from kldtool.codec.rows import decode_np
from kldtool.logitsfile import open_base_file

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def q2k_run(fixture_base, requant, tmp_path_factory):
    d = tmp_path_factory.mktemp("worst")
    run_cli("compare", "-m", requant("Q2_K"), "--kl-divergence-base", fixture_base, "--per-token", d / "q2k.h5")
    with h5py.File(d / "q2k.h5") as f:
        cols = {k: f[k][:] for k in f}
    return d / "q2k.h5", cols


def test_worst_positions_are_the_largest_klds_with_their_tokens(q2k_run, fixture_base, requant, tmp_path):
    path, cols = q2k_run
    run_cli("worst", path, "-n", 20, "--json", tmp_path / "w.json")
    rows = json.loads((tmp_path / "w.json").read_text())["rows"]
    top = np.argsort(-cols["kld"], kind="stable")[:20]
    assert [r["position"] for r in rows] == cols["position"][top].tolist()
    assert [r["kld"] for r in rows] == pytest.approx(cols["kld"][top].tolist(), rel=1e-12)
    reader = open_base_file(fixture_base)
    try:
        tokens, n_ctx, first = reader.tokens, reader.header.n_ctx, reader.header.first
        for r in rows:
            assert r["target_id"] == int(tokens[r["position"]])
            # the base's top-1 is the argmax (lowest id on a tie) of the row llama-perplexity stored
            chunk_rows = reader.read_chunk(r["chunk"])
            b = decode_np(chunk_rows[r["position"] - r["chunk"] * n_ctx - first - 1][None], reader.header.n_vocab)[0]
            assert r["top1_base_id"] == int(np.argmax(b))
    finally:
        reader.close()
    # the records' own agreement: same top <=> equal top-1 ids, for every token
    assert np.array_equal(cols["same_top"], cols["top1_q"] == cols["top1_base"])
    assert rows[0]["target"] and rows[0]["context"]


def test_worst_windows_rank_chunks_by_mean_kld(q2k_run, tmp_path):
    path, cols = q2k_run
    p = run_cli("worst", path, "-n", 3, "--by", "window", "--json", tmp_path / "w.json")
    rows = json.loads((tmp_path / "w.json").read_text())["rows"]
    ids = np.unique(cols["chunk"])
    means = np.array([cols["kld"][cols["chunk"] == c].astype(np.float64).mean() for c in ids])
    order = np.argsort(-means, kind="stable")[:3]
    assert [r["chunk"] for r in rows] == ids[order].tolist()
    assert [r["kld_mean"] for r in rows] == pytest.approx(means[order].tolist(), rel=1e-12)
    assert "mean KLD" in p.stdout


def test_worst_refuses_bad_flags_and_a_missing_base(q2k_run, tmp_path):
    path, _ = q2k_run
    p = run_cli("worst", path, "--by", "size", check_rc=None)
    assert p.returncode != 0 and "--by 'size'" in p.stderr.strip().splitlines()[-1]
    p = run_cli("worst", path, "--base", tmp_path / "gone.kld", check_rc=None)
    assert p.returncode != 0 and "give --base FILE" in p.stderr.strip().splitlines()[-1]
