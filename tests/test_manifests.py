"""Manifests: every base file and result records how its numbers were computed, and report,
diff and merge refuse runs whose manifests disagree on what changes the numbers (--mix allows).

One llama.cpp build per machine is all this project makes (AVX2, scripts/setup.sh), so a result
from an AVX-512 build is made here by editing a real result's manifest, as such a file would
read; the dtype case is two real runs."""

import json

import h5py
import pytest

from conftest import WIKI, run_cli
from kldtool.analysis.state_file import load_state, save_state

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def runs(fixture_compares, tmp_path_factory):
    """Q8_0.json/.h5 and Q2_K.json/.h5 of one directory (the run's shared compares, linked)."""
    d = tmp_path_factory.mktemp("manifests")
    for q in ("Q8_0", "Q2_K"):
        for kind in ("json", "h5"):
            (d / f"{q}.{kind}").symlink_to(fixture_compares / q / f"{q}.{kind}")
    return d


def last_line(p) -> str:
    return p.stderr.strip().splitlines()[-1]


@pytest.mark.full_tier
def test_base_files_and_results_record_their_manifest(runs, q4_1_gguf, tmp_path):
    base = tmp_path / "b.kldt"
    run_cli("base", "-m", q4_1_gguf, "-f", WIKI, "-c", 128, "--chunks", 2, "--kl-divergence-base", base)
    m = json.loads(run_cli("info", base, "--json").stdout)["metadata"]["manifest"]
    assert m["engine"] == "llamacpp" and m["device_kind"] == "cpu" and m["tokenizer"].startswith("sha256:")
    assert "AVX2" in m["cpu_isa"].split() and "AVX512" not in m["cpu_isa"]  # the build setup.sh pins
    r = json.loads((runs / "Q8_0.json").read_text())
    assert r["manifest"]["cpu_isa"] == m["cpu_isa"] and r["manifest"]["versions"]["llama-cpp-python"]


def test_report_and_diff_refuse_two_instruction_sets(runs, tmp_path):
    other = json.loads((runs / "Q2_K.json").read_text())
    other["manifest"]["cpu_isa"] += " AVX512F AVX512BW"
    (tmp_path / "Q2_K.json").write_text(json.dumps(other))
    p = run_cli("report", runs / "Q8_0.json", tmp_path / "Q2_K.json", check_rc=None)
    assert p.returncode != 0 and "manifest field cpu_isa" in last_line(p) and "--mix" in last_line(p)
    run_cli("report", runs / "Q8_0.json", tmp_path / "Q2_K.json", "--mix")
    h5 = tmp_path / "Q2_K.h5"
    h5.write_bytes((runs / "Q2_K.h5").read_bytes())
    with h5py.File(h5, "r+") as f:
        run = json.loads(f.attrs["run"])
        run["manifest"]["cpu_isa"] += " AVX512F"
        f.attrs["run"] = json.dumps(run)
    p = run_cli("diff", runs / "Q8_0.h5", h5, check_rc=None)
    assert p.returncode != 0 and "manifest field cpu_isa" in last_line(p)
    run_cli("diff", runs / "Q8_0.h5", h5, "--mix")


@pytest.mark.full_tier
def test_report_refuses_two_dtypes(hf_base, fp32_dir, tmp_path):
    for dtype in ("float32", "bfloat16"):
        run_cli(
            "compare",
            "--engine",
            "transformers",
            "-m",
            fp32_dir,
            "--dtype",
            dtype,
            "--kl-divergence-base",
            hf_base,
            "--chunks",
            2,
            "--json",
            tmp_path / f"{dtype}.json",
        )
    p = run_cli("report", tmp_path / "float32.json", tmp_path / "bfloat16.json", check_rc=None)
    assert p.returncode != 0 and "manifest field dtype is 'bfloat16'" in last_line(p)


@pytest.mark.full_tier
def test_merge_takes_two_shards_of_one_run_and_refuses_a_stranger(fixture_base, requant, tmp_path):
    for a, b in ((0, 4), (4, 8)):
        run_cli(
            "compare",
            "-m",
            requant("Q8_0"),
            "--kl-divergence-base",
            fixture_base,
            "--chunk-range",
            f"{a}:{b}",
            "--state",
            tmp_path / f"s{a}.npz",
        )
    run_cli("merge", tmp_path / "s0.npz", tmp_path / "s4.npz", "--json", tmp_path / "m.json")
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["scored_tokens"] == 8 * 63 and merged["manifest"]["engine"] == "llamacpp"
    shard = load_state(str(tmp_path / "s4.npz"))
    shard.meta["manifest"]["versions"] = {"llama-cpp-python": "0.3.99"}
    save_state(str(tmp_path / "s4.npz"), shard)
    p = run_cli("merge", tmp_path / "s0.npz", tmp_path / "s4.npz", check_rc=None)
    assert p.returncode != 0 and "manifest field versions" in last_line(p)
    run_cli("merge", tmp_path / "s0.npz", tmp_path / "s4.npz", "--mix")
