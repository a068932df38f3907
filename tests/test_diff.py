"""``kldtool diff`` and ``report``'s ordering test: two quants against llama-perplexity's own
base file (the fixture), paired chunk by chunk, checked against a float64 numpy paired
bootstrap written here from the per-token columns (not from kldtool's accumulators)."""

import json

import h5py
import numpy as np
import pytest

from conftest import run_cli

pytestmark = pytest.mark.quick

SEED, RESAMPLES = 7, 500


@pytest.fixture(scope="module")
def runs(fixture_base, fixture_compares, requant, tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    out = {q: fixture_compares / q / f"{q}.h5" for q in ("Q8_0", "Q2_K")}
    # Q8_0 again, kept as a state file this time: the same run by the other kind of file.
    run_cli("compare", "-m", requant("Q8_0"), "--kl-divergence-base", fixture_base, "--state", d / "Q8_0-again.npz")
    out["Q8_0-again"] = d / "Q8_0-again.npz"
    return out


def reference(path_a, path_b) -> dict:
    """Paired block bootstrap in float64 numpy: per-chunk sums, one draw of all resamples."""

    def chunk_sums(path):
        with h5py.File(path) as f:
            chunk = f["chunk"][:]
            cols = {k: f[k][:].astype(np.float64) for k in ("kld", "nll_q", "nll_base", "same_top")}
            dp = f["dp"][:]
        ids = np.unique(chunk)
        at = np.searchsorted(ids, chunk)
        per = lambda x: np.bincount(at, weights=x, minlength=len(ids))  # noqa: E731
        return np.stack(
            [
                per(cols["kld"]),
                per(cols["nll_q"] - cols["nll_base"]),
                per(cols["same_top"]),
                per((dp * dp).astype(np.float64)),
                per(np.ones(len(chunk))),
            ],
            axis=1,
        )

    def measures(s):
        n = s[..., 4]
        return {
            "kld_mean": s[..., 0] / n,
            "ln_ppl_ratio": s[..., 1] / n,
            "same_top_p": s[..., 2] / n,
            "rms_dp": np.sqrt(s[..., 3] / n),
        }

    a, b = chunk_sums(path_a), chunk_sums(path_b)
    n = len(a)
    picks = np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))
    ra, rb = measures(a[picks].sum(axis=1)), measures(b[picks].sum(axis=1))
    wa, wb = measures(a.sum(axis=0)), measures(b.sum(axis=0))
    return {k: {"difference": wa[k] - wb[k], "interval_95": np.percentile(ra[k] - rb[k], [2.5, 97.5])} for k in ra}


def diff_json(a, b, tmp_path) -> tuple[dict, str]:
    p = run_cli("diff", a, b, "--bootstrap", RESAMPLES, "--seed", SEED, "--json", tmp_path / "d.json")
    return json.loads((tmp_path / "d.json").read_text()), p.stdout


@pytest.mark.full_tier
def test_q8_0_against_q2_k_is_significant_and_equals_numpy(runs, tmp_path):
    got, text = diff_json(runs["Q8_0"], runs["Q2_K"], tmp_path)
    print(text)
    ref = reference(runs["Q8_0"], runs["Q2_K"])
    for k, r in ref.items():
        m = got["measures"][k]
        assert m["difference"] == pytest.approx(r["difference"], rel=1e-9, abs=1e-12), k
        assert m["interval_95"] == pytest.approx(list(r["interval_95"]), rel=1e-9, abs=1e-12), k
    kld = got["measures"]["kld_mean"]
    assert kld["significant"] and kld["difference"] < 0 and kld["a_wins"] == kld["chunks"]
    assert got["measures"]["same_top_p"]["significant"] and got["measures"]["same_top_p"]["difference"] > 0
    assert "mean KLD: requant-Q8_0.gguf's is lower than requant-Q2_K.gguf's by" in text


def test_a_run_against_its_rerun_is_not_significant(runs, tmp_path):
    got, text = diff_json(runs["Q8_0"], runs["Q8_0-again"], tmp_path)
    for k, m in got["measures"].items():
        assert not m["significant"] and m["difference"] == 0 and m["a_wins"] == m["b_wins"] == 0, k
    assert "mean KLD: no significant difference" in text


@pytest.mark.full_tier
def test_diff_refuses_what_it_cannot_pair(runs, fixture_base, requant, tmp_path):
    other = tmp_path / "other.h5"
    run_cli("compare", "-m", requant("Q8_0"), "--kl-divergence-base", fixture_base, "--chunks", 4, "--per-token", other)
    for args, says in (
        ((runs["Q8_0"], fixture_base), "not a compare --per-token HDF5 file or a compare --state file"),
        ((runs["Q8_0"], tmp_path / "none.h5"), "no such file"),
        ((runs["Q8_0"], other), "covers other chunks"),
    ):
        p = run_cli("diff", *args, check_rc=None)
        assert p.returncode != 0 and says in p.stderr.strip().splitlines()[-1], p.stderr
    p = run_cli("diff", runs["Q8_0"], runs["Q2_K"], "--bootstrap", 0, check_rc=None)
    assert p.returncode != 0 and "--bootstrap 0" in p.stderr


def _pair_line(text: str, a: str, b: str) -> tuple[float, list[float], str]:
    line = next(l for l in text.splitlines() if l.strip().lstrip("- ").startswith(f"{a} vs {b}:"))
    d = float(line.split("A − B ")[1].split()[0])
    lo, hi = (float(x) for x in line.split("[")[1].split("]")[0].split(","))
    return d, [lo, hi], line


def test_report_pairs_adjacent_rows_as_numpy_does(runs, tmp_path):
    jsons = [runs[q].with_suffix(".json") for q in ("Q8_0", "Q2_K")]
    p = run_cli("report", *jsons, "--bootstrap", RESAMPLES, "--seed", SEED, "--markdown", tmp_path / "r.md")
    ref = reference(runs["Q2_K"], runs["Q8_0"])["kld_mean"]  # sorted by size: Q2_K first
    for text in (p.stdout, (tmp_path / "r.md").read_text()):
        d, interval, line = _pair_line(text, "Q2_K", "Q8_0")
        assert d == pytest.approx(ref["difference"], abs=1e-6) and "significant" in line and "not" not in line
        assert interval == pytest.approx(list(ref["interval_95"]), abs=1e-6)


@pytest.mark.full_tier
def test_report_labels_differences_below_the_noise_floor(runs, fixture_base, q4_1_gguf, tmp_path):
    floor = tmp_path / "floor.json"
    run_cli("noise-floor", "--kl-divergence-base", fixture_base, "-m", q4_1_gguf, "-b", 512, "--json", floor)
    jsons = [runs[q].with_suffix(".json") for q in ("Q8_0", "Q2_K")]
    real = run_cli("report", *jsons, "--noise-floor", floor).stdout
    assert _pair_line(real, "Q2_K", "Q8_0")[2].endswith("significant; Q2_K lower in 0 of 8 chunks")
    # The same file claiming a floor above the pair's difference (0.48): labelled, not "significant".
    data = json.loads(floor.read_text())
    data["noise_floor"]["kld_mean"]["value"] = 0.5
    high = tmp_path / "high.json"
    high.write_text(json.dumps(data))
    assert (
        "below the noise floor 0.500000"
        in _pair_line(run_cli("report", *jsons, "--noise-floor", high).stdout, "Q2_K", "Q8_0")[2]
    )
    data["base"] = {"other": True}
    high.write_text(json.dumps(data))
    p = run_cli("report", *jsons, "--noise-floor", high, check_rc=None)
    assert p.returncode != 0 and "measured on another base file" in p.stderr.strip().splitlines()[-1]
