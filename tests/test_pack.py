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
    d = tmp_path_factory.mktemp("pack")
    run_cli("pack", fixture_base, "-o", d / "pack")
    return d, d / "pack", requant("Q2_K")


@pytest.fixture(scope="module")
def victim(packed):
    """A copy of the pack that the tests below alter, each restoring it after."""
    d, pack, _ = packed
    shutil.copytree(pack, d / "victim")
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
    gone = run_cli("verify", "kldtool-test/not-there", env_extra=env, check_rc=UsageError.exit_code)
    assert "not a reference pack" in gone.stderr


@pytest.mark.parametrize(
    "name, where, code",
    [
        (None, 0, CorruptData.exit_code),  # the base file's header, its first byte
        (None, -1, CorruptData.exit_code),  # the last row's last byte
        ("README.md", 10, CorruptData.exit_code),
        ("manifest.json", 0, MetadataError.exit_code),
    ],
)
def test_one_flipped_byte_anywhere_is_refused(packed, victim, fixture_base, tmp_path, name, where, code):
    quant, bad = packed[2], victim
    path = bad / (name or fixture_base.name)
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
    assert sorted(os.listdir(tmp_path)) == []
