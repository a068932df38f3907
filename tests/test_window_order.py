"""compare --order random[:SEED] and --target-ci on llama.cpp's fixture base (8 windows of 512
tokens) with a real requantized GGUF: the windows come in numpy's permutation, a full run in any
order ends with the file-order run's statistics, shards in random order merge into it, an
early-stopped run says why and resumes exactly."""

import csv
import json

import numpy as np
import pytest

from conftest import chunk_table_lines, run_cli

SEED = 5


@pytest.fixture(scope="module")
def runs(requant, fixture_base, tmp_path_factory):
    d = tmp_path_factory.mktemp("order")
    model = requant("Q2_K")
    common = ("compare", "--kl-divergence-base", fixture_base, "-m", model)
    file_order = run_cli(*common, "--json", d / "file.json")
    shuffled = run_cli(
        *common, "--order", f"random:{SEED}", "--json", d / "random.json", "--per-token", d / "random.h5"
    )
    return d, common, file_order, shuffled


def _visited(stdout: str) -> list[int]:
    return [int(line.split()[0]) - 1 for line in chunk_table_lines(stdout)]


def test_random_order_visits_numpys_permutation_and_ends_with_the_file_orders_statistics(runs):
    d, _, file_order, shuffled = runs
    assert _visited(shuffled.stdout) == np.random.default_rng(SEED).permutation(8).tolist()
    assert _visited(file_order.stdout) == list(range(8))
    a, b = (json.loads((d / n).read_text()) for n in ("file.json", "random.json"))
    assert b["order"] == {"kind": "random", "seed": SEED} and a["order"] == {"kind": "file"}
    assert b["statistics"] == a["statistics"] and b["chunk_sums"] == a["chunk_sums"]
    # The printed statistics blocks are the same text, whatever the order the chunks came in.
    tail = lambda s: s[s.index("====== Perplexity statistics") :]  # noqa: E731
    assert tail(shuffled.stdout) == tail(file_order.stdout)


def test_per_token_file_records_the_order(runs):
    import h5py

    d, *_ = runs
    with h5py.File(d / "random.h5", "r") as f:
        chunks = f["chunk"][:]
        run = json.loads(f.attrs["run"])
    firsts = [int(c) for i, c in enumerate(chunks) if i == 0 or chunks[i - 1] != c]
    assert firsts == np.random.default_rng(SEED).permutation(8).tolist()
    assert run["order"] == {"kind": "random", "seed": SEED}
    run_cli("report", d / "random.h5", "--csv", d / "random.csv")  # the tokens, read back in window order
    row = next(csv.DictReader(open(d / "random.csv")))
    stats = json.loads((d / "random.json").read_text())["statistics"]
    assert float(row["kld_mean"]) == stats["kld_mean"]["value"] and float(row["ppl_q"]) == stats["ppl_q"]["value"]


def test_random_order_shards_merge_into_the_file_order_run(runs, tmp_path):
    _, common, file_order, _ = runs
    states = [tmp_path / "a.state", tmp_path / "b.state"]
    # Four windows of 128 tokens fill one ubatch, as the whole run's eight fill two: the same kernels
    # (a batch of five would take other ones: engines/llamacpp/engine.py), so the same numbers.
    for r, s in zip(("4:8", "0:4"), states):
        run_cli(*common, "--order", "random:2", "--chunk-range", r, "--state", s)
    merged = run_cli("merge", *states)
    assert merged.stdout == file_order.stdout  # every running line and block, character for character


def test_target_ci_stops_early_says_why_and_resumes_to_the_same_end(runs, tmp_path):
    _, common, _, _ = runs
    # Batches of two windows, so that the looks at 2 and 4 windows fall between batches.
    common = (*common, "-b", "256", "--order", f"random:{SEED}")
    state, early = tmp_path / "s.state", tmp_path / "early.json"
    p = run_cli(*common, "--target-ci", "0.5", "--min-chunks", "2", "--state", state, "--json", early)
    got = json.loads(early.read_text())
    stopped = got["stopped"]
    assert stopped["reason"] == "target" and stopped["windows"] == got["windows_scored"] < 8
    assert len(chunk_table_lines(p.stdout)) == stopped["windows"]
    assert f"Stopped after {stopped['windows']} of 8 windows" in p.stdout and "--target-ci 50.00%" in p.stdout
    lo, hi = stopped["interval"]
    assert lo <= got["statistics"]["kld_mean"]["value"] <= hi and hi - lo <= stopped["kld_mean"]
    # The interval's centre is the visited windows' mean KLD, from their sums in float64.
    v = np.asarray(got["chunk_sums"]["vectors"])
    assert stopped["kld_mean"] == pytest.approx(v[:, 5].sum() / v[:, -1].sum(), rel=1e-12)
    resumed = run_cli(*common, "--state", state, "--resume", "--json", tmp_path / "r.json")
    assert "resuming" in resumed.stderr and f"holds {stopped['windows']} of the 8 windows" in resumed.stderr
    uninterrupted = run_cli(*common, "--json", tmp_path / "u.json")
    whole, once = (json.loads((tmp_path / n).read_text()) for n in ("r.json", "u.json"))
    assert whole["stopped"] is None and whole["windows_scored"] == 8
    assert whole["statistics"] == once["statistics"]
    assert chunk_table_lines(resumed.stdout) == chunk_table_lines(uninterrupted.stdout)


def test_a_checkpoint_in_one_order_is_not_resumed_in_another(runs, tmp_path):
    _, common, _, _ = runs
    state = tmp_path / "s.state"
    run_cli(*common, "--order", "random:1", "--chunk-range", "0:2", "--state", state)
    p = run_cli(*common, "--order", "random:2", "--chunk-range", "0:2", "--state", state, "--resume", check_rc=8)
    (line,) = p.stderr.strip().splitlines()
    assert "order random:1" in line and "--order random:2" in line


@pytest.mark.parametrize(
    "flags, words",
    [
        (("--target-ci", "0.02"), "needs --order random"),
        (("--order", "random:x"), "--order random:x"),
        (("--order", "shuffle"), "expected file, random or random:SEED"),
        (("--order", "random", "--target-ci", "1.5"), "--target-ci 1.5"),
        (("--order", "random", "--target-ci", "0.1", "--min-chunks", "1"), "--min-chunks 1"),
    ],
)
@pytest.mark.quick
def test_bad_order_and_target_flags_are_one_line_usage_errors(requant, fixture_base, flags, words):
    p = run_cli("compare", "--kl-divergence-base", fixture_base, "-m", requant("Q2_K"), *flags, check_rc=2)
    (line,) = p.stderr.strip().splitlines()
    assert words in line and "Traceback" not in p.stderr
