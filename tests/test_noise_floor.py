"""kldtool noise-floor and compare --noise-floor on the real SmolLM2 GGUF."""

import json

import pytest

from conftest import WIKI, run_cli

pytestmark = pytest.mark.quick


@pytest.mark.full_tier
def test_noise_floor_and_multiple(tmp_path, requant):
    base, other = tmp_path / "b.kldt", tmp_path / "o.kldt"
    run_cli("base", "-f", WIKI, "-c", 128, "--chunks", 2, "--kl-divergence-base", base)
    run_cli("base", "-f", WIKI, "-c", 128, "--chunks", 3, "--kl-divergence-base", other)
    same = run_cli("noise-floor", "--kl-divergence-base", base, check_rc=2)
    assert "the floor would be 0" in same.stderr
    floor = tmp_path / "floor.json"
    run_cli("noise-floor", "--kl-divergence-base", base, "-b", 128, "--json", floor)
    f = json.loads(floor.read_text())
    assert f["command"] == "noise-floor" and f["noise_floor"]["this_path"]["n_seq"] == 1
    value = f["noise_floor"]["kld_mean"]["value"]
    assert 0 < abs(value) < 1e-3  # another path's rounding, not nothing; its sign is the text's
    out = tmp_path / "q.json"
    p = run_cli("compare", "--kl-divergence-base", base, "-m", requant("Q4_K_M"), "--noise-floor", floor, "--json", out)
    stats = json.loads(out.read_text())["statistics"]
    # A floor at or below 0 (the stored rows' rounding outweighs the other path's) is no scale: infinity.
    want = stats["kld_mean"]["value"] / value if value > 0 else float("inf")
    assert stats["noise_floor"]["multiple"] == pytest.approx(want)
    assert "x the noise floor" in p.stdout + p.stderr
    wrong = run_cli(
        "compare", "--kl-divergence-base", other, "-m", requant("Q4_K_M"), "--noise-floor", floor, check_rc=2
    )
    assert "another base file" in wrong.stderr


def test_what_is_not_a_base_file_is_one_line_and_writes_nothing(tmp_path):
    """The edit loop's check of the command: a missing file and a file that is not a base file
    are each one line naming the file, a non-zero exit and no --json file."""
    out = tmp_path / "floor.json"
    junk = tmp_path / "junk.kldt"
    junk.write_bytes(b"not a logits file\n")
    for path, words in ((tmp_path / "none.kldt", "no such file"), (junk, "not a base file")):
        p = run_cli("noise-floor", "--kl-divergence-base", path, "--json", out, check_rc=None)
        (line,) = p.stderr.strip().splitlines()
        assert p.returncode != 0 and str(path) in line and words in line, p.stderr
        assert not out.exists()
