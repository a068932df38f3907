"""KLD by depth in every compare: the table's buckets against a float64 numpy grouping of the
run's own per-token file (window starts from the protocol, not from kldtool), adding up to
the run's tokens and KLD sum, printed with --depth-bins, and refused when malformed."""

import json

import h5py
import numpy as np
import pytest

from conftest import WIKI, run_cli

CTX = 256


@pytest.fixture(scope="module")
def runs(requant, fixture_base, q4_1_gguf, tmp_path_factory):
    """(result, per-token columns, window length, printed text) of two compares: llama.cpp's
    protocol (scored half: linear buckets) and exl3 (every position: log2 buckets)."""
    d = tmp_path_factory.mktemp("depth")
    exl3 = d / "exl3.kldt"
    run_cli("base", "-m", q4_1_gguf, "-f", WIKI, "--protocol", "exl3", "-c", CTX, "--stride", CTX, "--chunks", 4,
            "--kl-divergence-base", exl3)  # fmt: skip
    out = {}
    for name, base, ctx, bins in (("llamacpp", fixture_base, 128, "log2"), ("exl3", exl3, CTX, None)):
        flags = ["--depth-bins", bins] if bins else []
        p = run_cli("compare", "-m", requant("Q4_0"), "--kl-divergence-base", base, "--json", d / f"{name}.json",
                    "--per-token", d / f"{name}.h5", *flags)  # fmt: skip
        with h5py.File(d / f"{name}.h5", "r") as f:
            cols = {k: f[k][:] for k in ("chunk", "position", "kld", "dp", "same_top")}
        out[name] = (json.loads((d / f"{name}.json").read_text()), cols, ctx, p.stdout)
    return out


def numpy_buckets(cols: dict, ctx: int, bounds: list[int]) -> list[dict]:
    depth = cols["position"].astype(np.int64) - cols["chunk"].astype(np.int64) * ctx  # windows start at k * ctx
    rows = []
    for lo, hi in zip(bounds, bounds[1:]):
        m = (depth >= lo) & (depth < hi)
        if m.any():
            dp = cols["dp"][m].astype(np.float32)
            rows.append(
                {
                    "tokens": int(m.sum()),
                    "kld_sum": float(np.sum(cols["kld"][m].astype(np.float64))),
                    "same_top_p": float(cols["same_top"][m].mean()),
                    "rms_dp": float(np.sqrt(np.sum((dp * dp).astype(np.float64)) / m.sum())),
                    "windows": len(np.unique(cols["chunk"][m])),
                }
            )
    return rows


@pytest.mark.parametrize("name", ["llamacpp", "exl3"])
def test_depth_table_is_the_per_token_files_grouping(runs, name):
    result, cols, ctx, _ = runs[name]
    table = result["statistics"]["depth"]
    bounds = table["bounds"]
    if name == "exl3":
        assert bounds == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # log2 over depths 1..255
    else:
        assert bounds[0] == 65 and bounds[-1] == 128 and len(bounds) == 9  # the scored half, 8 equal buckets
    ref = numpy_buckets(cols, ctx, bounds)
    assert len(ref) == len(table["rows"])
    for ours, theirs in zip(table["rows"], ref):
        assert ours["tokens"] == theirs["tokens"] and ours["windows"] == theirs["windows"]
        assert ours["kld_sum"] == pytest.approx(theirs["kld_sum"], rel=1e-12)
        assert ours["same_top_p"] == theirs["same_top_p"]
        assert ours["rms_dp"] == pytest.approx(theirs["rms_dp"], rel=1e-12)
        lo, hi = ours["kld_mean_interval_95"]
        assert lo <= ours["kld_mean"] <= hi
    # The buckets partition the run: its token count and KLD sum, to 1e-12 relative.
    sums = result["chunk_sums"]
    kld = sum(v[sums["columns"].index("kld")] for v in sums["vectors"])
    assert sum(r["tokens"] for r in table["rows"]) == result["scored_tokens"] == len(cols["kld"])
    assert sum(r["kld_sum"] for r in table["rows"]) == pytest.approx(kld, rel=1e-12)


def test_depth_table_is_printed_only_when_asked(runs):
    for name, shown in (("llamacpp", True), ("exl3", False)):
        result, _, _, text = runs[name]
        assert ("KLD by depth" in text) == shown
        if shown:
            lines = text.split("KLD by depth")[1].splitlines()[2:]
            printed = [line.split()[0] for line in lines[: len(result["statistics"]["depth"]["rows"])]]
            assert printed == [r["bucket"] for r in result["statistics"]["depth"]["rows"]]


def test_explicit_depth_bins(requant, runs, tmp_path):
    result, cols, ctx, _ = runs["exl3"]
    base = result["base_file"]["path"]
    got = run_cli("compare", "-m", requant("Q4_0"), "--kl-divergence-base", base, "--chunks", 2,
                  "--depth-bins", "16,100,1000", "--json", tmp_path / "c.json")  # fmt: skip
    table = json.loads((tmp_path / "c.json").read_text())["statistics"]["depth"]
    assert table["bounds"] == [1, 16, 100, 256]  # a first bucket from 1; 1000 is past the deepest
    assert [r["bucket"] for r in table["rows"]] == ["1-15", "16-99", "100-255"]
    assert "100-255" in got.stdout


@pytest.mark.quick
@pytest.mark.parametrize("spec", ["5,3", "0,10", "log3", "1,,2"])
def test_malformed_depth_bins_fail_in_one_line(spec, fixture_base):
    p = run_cli("compare", "--kl-divergence-base", fixture_base, "--depth-bins", spec, check_rc=None)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--depth-bins {spec}" in lines[0], p.stderr


def test_report_draws_kld_by_depth(runs, tmp_path):
    result, _, _, _ = runs["exl3"]
    js = tmp_path / "exl3.json"
    js.write_text(json.dumps(result))
    run_cli("report", js, "--plots", tmp_path / "plots")
    png = (tmp_path / "plots" / "kld_by_depth.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
