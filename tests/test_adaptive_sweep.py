"""kldtool sweep on llama.cpp's fixture base (8 windows) with three real requants: the ranking of
the full compares, each full mean KLD inside the quant's interval, fewer windows than a full
sweep, and a rerun that resumes instead of scoring again."""

import json

import pytest

from conftest import run_cli, run_script

TYPES = ("Q8_0", "Q4_K_M", "Q2_K")


@pytest.fixture(scope="module")
def swept(requant, fixture_base, tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    models = [x for t in TYPES for x in ("-m", requant(t))]
    # Batches of two windows (-b 256), so that rounds of 2 and 4 windows end between batches.
    args = ("sweep", "--kl-divergence-base", fixture_base, *models, "-o", d / "out", "--min-chunks", "2", "-b", "256")
    first = run_cli(*args, "--markdown", d / "table.md")
    full = {}
    for t in TYPES:
        out = d / f"full-{t}.json"
        run_cli("compare", "--kl-divergence-base", fixture_base, "-m", requant(t), "-b", "256", "--json", out)
        full[t] = json.loads(out.read_text())["statistics"]["kld_mean"]["value"]
    return d, args, first, full


def test_sweep_ranks_as_the_full_compares_inside_its_intervals_with_fewer_windows(swept):
    d, _, first, full = swept
    log = json.loads((d / "out" / "sweep.json").read_text())
    got = {k.removeprefix("requant-"): v for k, v in log["quants"].items()}
    assert sorted(got, key=lambda t: got[t]["kld_mean"]) == sorted(full, key=full.get)
    for t, q in got.items():
        assert q["interval"][0] <= full[t] <= q["interval"][1], (t, q, full[t])
        assert q["of"] == 8 and q["stopped"] in ("told apart from its neighbours", "every window scored")
    assert sum(q["windows"] for q in got.values()) < 8 * len(TYPES)
    assert log["rounds"][0] == {
        "windows": 2,
        "players": [f"requant-{t}" for t in TYPES],
        "verdicts": log["rounds"][0]["verdicts"],
    }
    # Each quant's compare result is a report input: same statistics as the sweep's table rows.
    for t in TYPES:
        r = json.loads((d / "out" / f"requant-{t}.json").read_text())
        assert r["order"] == {"kind": "random", "seed": 0} and r["windows_scored"] == got[t]["windows"]
        assert r["statistics"]["kld_mean"]["value"] == pytest.approx(got[t]["kld_mean"], rel=1e-12)
    assert "Sweep: 3 quants" in first.stdout and "paired block bootstrap" in first.stdout
    assert "| requant-Q2_K |" in (d / "table.md").read_text()


def test_a_rerun_resumes_and_scores_nothing(swept):
    d, args, first, _ = swept
    again = run_cli(*args)
    assert "round to" not in again.stderr
    assert again.stdout == first.stdout


def test_a_rerun_with_other_flags_is_refused(swept):
    d, args, _, _ = swept
    p = run_cli(*args, "--order", "random:9", check_rc=8)
    (line,) = p.stderr.strip().splitlines()
    assert "sweep.json" in line and "order" in line and "-o" in line


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--order", "file"), "needs random"),
        (("--bootstrap", "10"), "at least 100 resamples"),
    ],
)
@pytest.mark.quick
def test_bad_sweep_flags_are_one_line_usage_errors(requant, fixture_base, tmp_path, extra, words):
    p = run_cli(
        "sweep", "--kl-divergence-base", fixture_base, "-m", requant("Q2_K"), "-o", tmp_path / "o", *extra, check_rc=2
    )
    (line,) = p.stderr.strip().splitlines()
    assert words in line


@pytest.mark.quick
def test_two_quants_of_one_name_are_refused(requant, fixture_base, tmp_path):
    q = requant("Q2_K")
    p = run_cli("sweep", "--kl-divergence-base", fixture_base, "-m", q, "-m", q, "-o", tmp_path / "o", check_rc=2)
    assert "two models are named requant-Q2_K" in p.stderr


def test_gguf_sweep_script_ranks_adaptively_with_a(fixture_base, q4_1_gguf, tmp_path):
    out = tmp_path / "out"
    run_script(
        "sweep_gguf.sh", "-s", q4_1_gguf, "-b", fixture_base, "-o", out, "-q", "Q8_0 Q2_K", "-a",
        "--", "--min-chunks", "2", "-b", "256",
    )  # fmt: skip
    log = json.loads((out / "sweep.json").read_text())
    assert set(log["quants"]) == {"Q8_0", "Q2_K"} and log["quants"]["Q2_K"]["windows"] < 8
    assert "Sweep: 2 quants" in (out / "sweep.txt").read_text()
    report = (out / "report.md").read_text()
    assert "| Q8_0 |" in report and "| Q2_K |" in report and "Q2_K vs Q8_0" in report
