"""``report --card``: the model-card block for two requants of the built-in model against
llama-perplexity's own base file. Every number in its table is the runs' JSON at the printed
precision, its receipts name what the rows were measured against and how, a row's recorded
command run again gives that row, and runs of two references are refused."""

import json
import shlex

import pytest

from conftest import run_cli
from kldtool.errors import UsageError

pytestmark = pytest.mark.quick

QUANTS = ("Q8_0", "Q2_K")


def _table(text: str) -> dict[str, dict[str, str]]:
    """The card's table as {quant: {header: cell}}, read back as Markdown."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1].replace("|", "").replace("-", "").replace(":", "")) <= {""}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    return {r[0]: dict(zip(head, r)) for r in rows}


@pytest.fixture(scope="module")
def card(fixture_compares, tmp_path_factory):
    d = tmp_path_factory.mktemp("card")
    results = [fixture_compares / q / f"{q}.json" for q in QUANTS]
    run_cli("report", *results, "--card", d / "card.md", "--title", "SmolLM2-135M requants")
    runs = {q: json.loads(p.read_text()) for q, p in zip(QUANTS, results)}
    return (d / "card.md").read_text(), runs, results


def test_every_number_is_the_runs_at_the_printed_precision(card):
    text, runs, _ = card
    table = _table(text)
    assert list(table) == ["Q2_K", "Q8_0"]  # sorted by size
    for q, run in runs.items():
        s, row = run["statistics"], table[q]
        for header, key, scale in (
            ("mean KLD", "kld_mean", 1),
            ("ln(PPL(Q)/PPL(base))", "ln_ppl_ratio", 1),
            ("same top %", "same_top_p", 100),
            ("RMS Δp %", "rms_dp", 100),
        ):
            fmt = "%.6f" if scale == 1 else "%.3f"
            assert row[header] == f"{fmt % (scale * s[key]['value'])} ± {fmt % (scale * s[key]['uncertainty'])}"
        assert row["99% KLD"] == "%.6f" % s["kld_quantiles"]["99.0%"]
        assert row["size GiB"] == "%.3f" % (run["model_size"]["file_bytes"] / 2**30)
        assert row["bpw (all)"] == "%.3f" % run["model_size"]["bpw_total"]


def test_the_receipts_name_the_reference_and_each_rows_command(card):
    text, runs, _ = card
    receipts = text.split("Receipts:", 1)[1]
    first = runs["Q8_0"]
    assert first["base"]["tokens_sha256"] in receipts and first["tokenizer_identity"]["model"] in receipts
    assert f"kldtool {first['kldtool_version']}" in receipts and "protocol llamacpp" in receipts
    for q, run in runs.items():
        line = next(x for x in receipts.splitlines() if x.startswith(f"- {q}:"))
        assert shlex.join(run["command_line"]) in line and "llama-cpp-python" in line


def test_a_rows_recorded_command_gives_the_row_again(card, tmp_path):
    """Q2_K's command line from the card, run again (its output files sent here): the same
    statistics, value for value."""
    text, runs, _ = card
    line = next(x for x in text.splitlines() if x.startswith("- Q2_K:"))
    argv = shlex.split(line.split("`")[1])
    assert argv[:2] == ["kldtool", "compare"]
    for flag, name in (("--json", "again.json"), ("--per-token", "again.h5")):
        argv[argv.index(flag) + 1] = str(tmp_path / name)
    run_cli(*argv[1:])
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["statistics"] == runs["Q2_K"]["statistics"]


@pytest.mark.parametrize("receipt", ["base", "tokenizer"])
def test_runs_of_two_references_are_refused(card, tmp_path, receipt):
    """A run of another base file (its tokens differ) or another tokenizer beside them: one
    line naming the difference, no card, even with --mix."""
    _, runs, results = card
    other = dict(runs["Q8_0"])
    if receipt == "base":
        other["base"] = {**other["base"], "tokens_sha256": "0" * 64}
    else:
        other["tokenizer_identity"] = {**other["tokenizer_identity"], "model": "sha256:" + "1" * 64}
    (tmp_path / "other.json").write_text(json.dumps(other))
    out = tmp_path / "card.md"
    p = run_cli("report", results[1], tmp_path / "other.json", "--mix", "--card", out, check_rc=UsageError.exit_code)
    (line,) = p.stderr.strip().splitlines()
    assert "other.json" in line and ("tokens_sha256" if receipt == "base" else "tokenizer") in line
    assert not out.exists()


def test_the_recorded_command_holds_no_secret(monkeypatch):
    """A URL's user and password and any key of the environment never reach a result's command."""
    from kldtool.provenance.command_line import command_line

    monkeypatch.setenv("KLDTOOL_ENDPOINT_KEY", "sk-kldtool-test-secret")
    argv = ["compare", "--endpoint", "https://user:pw@host:8000/v1", "--endpoint-model", "x-sk-kldtool-test-secret"]
    assert command_line(argv) == [
        "kldtool",
        "compare",
        "--endpoint",
        "https://***@host:8000/v1",
        "--endpoint-model",
        "x-***",
    ]
