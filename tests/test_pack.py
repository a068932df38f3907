"""Reference packs (``kldtool pack``, ``verify``, ``compare --kl-divergence-base DIR``) on
llama-perplexity's own base file of the built-in model: a quant compared against the pack prints
what it prints against the file; the pack is found by a hub dataset's name in a local hub cache,
offline; and any byte changed in any of its files, a file added or a link put in a file's place
is refused in one line with the exit code of its kind, by verify and by compare alike."""

import json
import os
import shutil

import pytest

from conftest import run_cli
from kldtool.errors import CorruptData, MetadataError, UsageError

pytestmark = pytest.mark.quick

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def packed(fixture_base, requant, tmp_path_factory):
    """llama-perplexity's full-row file packed as it is, and packed by default (top-64 records)."""
    d = tmp_path_factory.mktemp("pack")
    run_cli("pack", fixture_base, "-o", d / "pack", "--keep", "all")
    run_cli("pack", fixture_base, "-o", d / "top")
    return d, d / "pack", requant("Q2_K")


@pytest.fixture(scope="module")
def victim(packed):
    """A copy of the top-64 pack that the tests below alter, each restoring it after."""
    d = packed[0]
    shutil.copytree(d / "top", d / "victim")
    return d / "victim"


@pytest.fixture(scope="module")
def direct(packed, fixture_base):
    """The quant compared against the base file itself: what the pack must give."""
    d, _, quant = packed
    return run_cli("compare", "-m", quant, "--kl-divergence-base", fixture_base, "--json", d / "direct.json")


@pytest.mark.full_tier
def test_a_quant_against_the_pack_prints_what_it_prints_against_the_file(packed, direct, fixture_base):
    d, pack, quant = packed
    assert sorted(os.listdir(pack)) == sorted(["README.md", fixture_base.name, "manifest.json"])
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["receipts"]["base"] == json.loads((d / "direct.json").read_text())["base"]
    assert "kldtool compare -m QUANT --kl-divergence-base DIR" in (pack / "README.md").read_text()
    via = run_cli("compare", "-m", quant, "--kl-divergence-base", pack, "--json", d / "via.json")
    assert via.stdout == direct.stdout
    a, b = (json.loads((d / n).read_text())["statistics"] for n in ("direct.json", "via.json"))
    assert a == b
    assert f"{pack}/{fixture_base.name}" in via.stderr  # named by its place in the pack


@pytest.mark.full_tier
def test_a_top64_pack_is_small_and_bounds_the_full_kld(packed, direct, fixture_base):
    """The default pack of the full file: top-64 records at most 1/50 of the raw file; against
    it, the quant's mean KLD lower bound sits at or below the full file's, and the estimate's
    interval covers it; PPL and Δp are exact."""
    d, _, quant = packed
    top = d / "top"
    name = f"{fixture_base.stem}.top64.kldt"
    assert sorted(os.listdir(top)) == sorted(["README.md", name, "manifest.json"])
    assert (top / name).stat().st_size <= fixture_base.stat().st_size / 50
    readme = (top / "README.md").read_text()
    out = json.loads((top / "manifest.json").read_text())["receipts"]["outside_mass"]
    assert f"{100 * out['mean']:.1f} % of the probability mass out" in readme and 0 < out["mean"] < out["p99"] < 1
    run_cli("compare", "-m", quant, "--kl-divergence-base", top, "--json", d / "top.json")
    full, got = (json.loads((d / n).read_text())["statistics"] for n in ("direct.json", "top.json"))
    c, exact = got["compact_base"], full["kld_mean"]["value"]
    assert c["keep"] == 64 and c["kld_mean_lower_bound"] <= exact <= c["kld_mean_lower_bound"] + c["bound"]
    for key in ("ppl_q", "ppl_base", "dp_mean"):
        assert got[key]["value"] == pytest.approx(full[key]["value"], rel=1e-6), key


@pytest.mark.full_tier
def test_found_by_a_hub_datasets_name_offline(packed, direct, tmp_path):
    d, pack, quant = packed
    cache = tmp_path / "hub"
    repo = cache / "datasets--kldtool-test--smollm2-ref"
    shutil.copytree(pack, repo / "snapshots" / REV)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    assert "2 files match" in run_cli("verify", "kldtool-test/smollm2-ref", env_extra=env).stdout
    by_name = run_cli("compare", "-m", quant, "--kl-divergence-base", "kldtool-test/smollm2-ref", env_extra=env)
    assert by_name.stdout == direct.stdout
    at_rev = run_cli("compare", "-m", quant, "--kl-divergence-base", f"kldtool-test/smollm2-ref@{REV}", env_extra=env)
    assert at_rev.stdout == direct.stdout
    gone = run_cli("verify", "kldtool-test/not-there", env_extra=env, check_rc=UsageError.exit_code)
    assert "not a reference pack" in gone.stderr


@pytest.mark.parametrize(
    "name, where, code",
    [
        (None, 0, CorruptData.exit_code),  # the base file's header, its first byte
        (None, -1, CorruptData.exit_code),  # its last byte
        ("README.md", 10, CorruptData.exit_code),
        ("manifest.json", 0, MetadataError.exit_code),
    ],
)
def test_one_flipped_byte_anywhere_is_refused(packed, victim, fixture_base, tmp_path, name, where, code):
    quant, bad = packed[2], victim
    path = bad / (name or f"{fixture_base.stem}.top64.kldt")
    with open(path, "r+b") as f:
        f.seek(where, os.SEEK_SET if where >= 0 else os.SEEK_END)
        at = f.tell()
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    try:
        compare = ("compare", "-m", quant, "--kl-divergence-base", bad, "--json", tmp_path / "r.json")
        for argv in (("verify", bad), compare):
            p = run_cli(*argv, check_rc=code)
            (line,) = p.stderr.strip().splitlines()
            assert str(bad) in line and "Traceback" not in p.stderr
        assert not (tmp_path / "r.json").exists()
    finally:
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(byte)
    run_cli("verify", bad)  # restored: whole again


def test_a_file_added_or_a_link_in_a_files_place_is_refused(victim, tmp_path):
    (victim / "notes.txt").write_text("hello")
    try:
        assert "notes.txt is not in its manifest" in run_cli("verify", victim, check_rc=CorruptData.exit_code).stderr
    finally:
        (victim / "notes.txt").unlink()
    os.replace(victim / "README.md", tmp_path / "elsewhere.md")
    os.symlink(tmp_path / "elsewhere.md", victim / "README.md")  # the same bytes, through a link
    try:
        p = run_cli("verify", victim, check_rc=CorruptData.exit_code)
        assert "README.md" in p.stderr and "cannot open it in the pack" in p.stderr
    finally:
        os.replace(tmp_path / "elsewhere.md", victim / "README.md")


def test_pack_refuses_an_existing_directory_and_leaves_nothing_half_written(packed, fixture_base, tmp_path):
    _, pack, _ = packed
    p = run_cli("pack", fixture_base, "-o", pack, check_rc=UsageError.exit_code)
    assert "exists" in p.stderr
    run_cli("pack", tmp_path / "no-such.kld", "-o", tmp_path / "p", check_rc=None)
    p = run_cli("pack", fixture_base, "-o", tmp_path / "p", "--keep", "top-3", check_rc=UsageError.exit_code)
    assert "K >= 10" in p.stderr
    p = run_cli("convert", fixture_base, tmp_path / "a.kld", "--keep", "top-64", "--to", "llamacpp", check_rc=2)
    assert "live in the kldtool container" in p.stderr
    top = packed[0] / "top" / f"{fixture_base.stem}.top64.kldt"
    p = run_cli("convert", top, tmp_path / "b.kldt", "--keep", "top-32", check_rc=UsageError.exit_code)
    assert "already holds top-64 records" in p.stderr
    assert sorted(os.listdir(tmp_path)) == []
