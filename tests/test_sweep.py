"""The GGUF sweep script end to end on SmolLM2: five llama.cpp quant types of the Q4_1 model
against llama-perplexity's own base file, the report (table, Markdown, CSV, plots) and the
per-token HDF5 files, each checked against what the compare runs printed and against a plain
float64 numpy computation."""

import csv
import json
import os

import numpy as np
import pytest

from conftest import (
    llamacpp_reference,
    ROOT,
    assert_lines_match,
    final_block_lines,
    markdown_rows,
    printed,
    run_cli,
    run_script,
)

TYPES = ["Q8_0", "Q6_K", "Q4_K_M", "Q3_K_M", "Q2_K"]
N_CHUNK, N_CTX = 8, 128


def sweep(*args):
    return run_script("sweep_gguf.sh", *args)


@pytest.fixture(scope="module")
def swept(fixture_base, q4_1_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    p = sweep("-s", q4_1_gguf, "-b", fixture_base, "-o", out, "-q", " ".join(TYPES))
    return out, p


def test_every_row_is_what_its_compare_printed(swept):
    out, _ = swept
    rows = markdown_rows(out / "report.md")
    assert sorted(rows) == sorted(TYPES)
    for t in TYPES:
        want = printed((out / f"{t}.txt").read_text())
        got = {k: rows[t][k] for k in want}
        assert got == want, t
    # The rows are sorted by size on disk, and the sizes are the files'.
    sizes = [float(r["size MiB"]) for r in rows.values()]
    assert sizes == sorted(sizes)
    for t in TYPES:
        assert float(rows[t]["size MiB"]) == pytest.approx(os.path.getsize(out / f"{t}.gguf") / 2**20, abs=0.05)
    print((out / "report.md").read_text())


def test_llama_perplexity_agrees_on_the_quants_it_measured(swept):
    out, _ = swept
    for t in ("Q2_K", "Q8_0"):
        ours = final_block_lines((out / f"{t}.txt").read_text())
        theirs = final_block_lines(llamacpp_reference(f"compare-{t}.txt").read_text())
        assert_lines_match(ours, theirs)


def test_csv_has_full_precision_of_the_json(swept):
    out, _ = swept
    with open(out / "report.csv") as f:
        rows = {r["quant"]: r for r in csv.DictReader(f)}
    for t in TYPES:
        s = json.loads((out / f"{t}.json").read_text())["statistics"]
        r = rows[t]
        assert float(r["kld_mean"]) == s["kld_mean"]["value"]
        assert float(r["kld_p999"]) == s["kld_quantiles"]["99.9%"]
        assert float(r["same_top_p_unc"]) == s["same_top_p"]["uncertainty"]
        assert float(r["bpw_linear"]) > 4


def test_rerun_does_no_work_twice(swept, fixture_base, q4_1_gguf):
    out, _ = swept
    before = {f: os.stat(out / f).st_mtime_ns for t in TYPES for f in (f"{t}.json", f"{t}.h5", f"{t}.gguf", f"{t}.txt")}
    p = sweep("-s", q4_1_gguf, "-b", fixture_base, "-o", out, "-q", " ".join(TYPES))
    assert p.stderr.count("skipped") == len(TYPES)
    assert "comparing" not in p.stderr and " -> " not in p.stderr  # no compare, no quantize
    assert before == {f: os.stat(out / f).st_mtime_ns for f in before}
    assert (out / "report.md").exists()


def test_plots_are_real_pictures(swept):
    from PIL import Image

    out, _ = swept
    names = sorted(os.listdir(out / "plots"))
    assert names == ["kld_by_depth.png", "kld_histograms.png", "kld_vs_bpw.png", "ppl_ratio_vs_bpw.png"]
    for n in names:
        with Image.open(out / "plots" / n) as im:
            assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 400
            grey = np.asarray(im.convert("L"))
        assert (grey < 200).mean() > 0.01, f"{n}: almost blank"
        assert len(np.unique(grey)) > 20, f"{n}: no text or lines drawn"


def test_per_token_files_against_float64_numpy(swept, fixture_base):
    import h5py

    out, _ = swept
    raw = np.fromfile(fixture_base, np.int32, count=5 + N_CTX * N_CHUNK)
    assert raw[2] == N_CTX and raw[4] == N_CHUNK
    tokens = raw[5:]
    for t in TYPES:
        with h5py.File(out / f"{t}.h5", "r") as f:
            cols = {k: f[k][:] for k in f}
            run = json.loads(f.attrs["run"])
        assert len(cols["kld"]) == N_CHUNK * (N_CTX - 1 - N_CTX // 2)
        assert run["model"]["model"].endswith(f"{t}.gguf")
        assert (tokens[cols["position"]] == cols["target"]).all()
        assert (cols["position"] // N_CTX == cols["chunk"]).all()
        assert (cols["position"] % N_CTX >= N_CTX // 2 + 1).all()
        want = printed((out / f"{t}.txt").read_text())
        nll = cols["nll_q"].astype(np.float64)
        kld = cols["kld"].astype(np.float64)
        dp = cols["dp"].astype(np.float64)
        check = {
            "PPL(Q)": np.exp(nll.mean()),
            "mean KLD": kld.mean(),
            "median KLD": np.median(kld),
            "same top %": 100 * cols["same_top"].mean(),
            "RMS Δp %": 100 * np.sqrt((dp * dp).mean()),
            "ln(PPL(Q)/PPL(base))": nll.mean() - cols["nll_base"].astype(np.float64).mean(),
        }
        for k, v in check.items():
            printed_value = want[k].split(" ± ")[0]
            decimals = len(printed_value.split(".")[1])
            assert abs(v - float(printed_value)) <= 1.01 * 10**-decimals, (t, k, v, printed_value)


def test_report_pools_per_token_shards_into_the_whole_run(swept, fixture_base, tmp_path):
    out, _ = swept
    model = out / "Q2_K.gguf"
    # One chunk per batch (-b 128), so shards and the whole run evaluate the very same batches.
    run_cli(
        "compare", "--kl-divergence-base", fixture_base, "-m", model, "-b", N_CTX, "--json", tmp_path / "whole.json"
    )
    for name, span in (("a", "0:3"), ("b", "3:8")):
        run_cli(
            "compare",
            "--kl-divergence-base",
            fixture_base,
            "-m",
            model,
            "-b",
            N_CTX,
            "--chunk-range",
            span,
            "--per-token",
            tmp_path / f"{name}.h5",
        )
    run_cli("report", tmp_path / "a.h5", tmp_path / "b.h5", "--csv", tmp_path / "pooled.csv")
    run_cli("report", tmp_path / "whole.json", "--csv", tmp_path / "whole.csv")
    (pooled,), (whole,) = (list(csv.DictReader(open(tmp_path / n))) for n in ("pooled.csv", "whole.csv"))
    numeric = [k for k in whole if k not in ("quant", "sources")]
    assert {k: pooled[k] for k in numeric} == {k: whole[k] for k in numeric}


def test_report_refuses_what_does_not_belong_together(swept, fixture_base_bos, tmp_path):
    out, _ = swept
    other = tmp_path / "other.json"  # the BOS base file: other tokens
    run_cli(
        "compare", "--kl-divergence-base", fixture_base_bos, "-m", out / "Q8_0.gguf", "--chunks", 2, "--json", other
    )
    p = run_cli("report", out / "Q2_K.json", other, check_rc=2)
    assert "another base file" in p.stderr and "--mix" in p.stderr and len(p.stderr.splitlines()) == 1
    run_cli("report", out / "Q2_K.json", other, "--mix")
    p = run_cli("report", out / "Q2_K.json", out / "Q2_K.h5", check_rc=2)
    assert "a second result for the model" in p.stderr
    bad = tmp_path / "broken.h5"
    bad.write_bytes((out / "Q2_K.h5").read_bytes()[:5000])
    p = run_cli("report", bad, check_rc=2)
    assert "broken.h5" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("report", ROOT / "pyproject.toml", check_rc=2)
    assert "not JSON" in p.stderr
    p = run_cli("report", out / "Q2_K.json", "--plots", out / "report.md", check_rc=7)  # a file, not a directory
    assert p.stderr.startswith("kldtool: error:") and "report.md" in p.stderr and "Traceback" not in p.stderr


def test_sweep_writes_a_missing_base_first(q4_1_gguf, tmp_path):
    from conftest import WIKI

    base = tmp_path / "base.kldt"
    p = sweep("-s", q4_1_gguf, "-b", base, "-o", tmp_path / "out", "-q", "Q8_0", "-f", WIKI, "-c", N_CTX, "-n", 2)
    assert "writing the base file" in p.stderr and base.exists()
    r = json.loads((tmp_path / "out" / "Q8_0.json").read_text())
    assert r["scored_tokens"] == 2 * (N_CTX - 1 - N_CTX // 2)
    assert r["model_size"]["bpw_linear"] == 8.5  # Q8_0: 34 bytes per block of 32


@pytest.mark.quick
def test_a_sweep_of_no_model_or_a_missing_base_is_one_line(fixture_base, tmp_path):
    p = run_cli("sweep", "--kl-divergence-base", fixture_base, "-o", tmp_path / "o", check_rc=2)
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
