"""Bad input ends in one line naming what and where, a class-specific exit code, no traceback,
and no output file that looks complete."""

import numpy as np
import pytest

from conftest import run_cli
from kldtool.errors import BaseFileError, CorpusError, MismatchError, UsageError


def one_line_error(p, code, *needles):
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    err = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(err) >= 1
    msg = err[-1]
    for n in needles:
        assert n in msg, msg
    return msg


def test_compare_missing_file(tmp_path):
    p = run_cli("compare", "--kl-divergence-base", tmp_path / "nope.kld", check_rc=None)
    one_line_error(p, BaseFileError.exit_code, "nope.kld", "no such file")


def test_compare_needs_a_base_file():
    one_line_error(run_cli("compare", check_rc=None), UsageError.exit_code, "--kl-divergence-base")


def test_compare_truncated_file(fixture_base, tmp_path):
    bad = tmp_path / "cut.kld"
    bad.write_bytes(fixture_base.read_bytes()[:30_000_000])
    p = run_cli("compare", "--kl-divergence-base", bad, check_rc=None)
    one_line_error(p, BaseFileError.exit_code, "cut.kld", "truncated rows", "chunk 4")


def test_vocab_mismatch(tmp_path, q4_1_gguf):
    f = tmp_path / "v1000.kld"
    n_ctx, v = 8, 1000
    rows = np.zeros((2 * (n_ctx - 1 - n_ctx // 2), v + 4), np.uint16)
    f.write_bytes(b"_logits_" + np.array([n_ctx, v, 2], "<i4").tobytes() + np.zeros(16, "<i4").tobytes() + rows.tobytes())
    p = run_cli("compare", "--kl-divergence-base", f, "-m", q4_1_gguf, check_rc=None)
    one_line_error(p, MismatchError.exit_code, "v1000.kld", "vocabulary of 1000", "49152")


def test_ctx_contradicting_the_file(fixture_base):
    p = run_cli("compare", "--kl-divergence-base", fixture_base, "-c", 512, check_rc=None)
    one_line_error(p, UsageError.exit_code, "-c 512", "-c 128")


@pytest.mark.parametrize("content, needle", [
    (b"", "empty text"),
    (b"\n\n  \n", "empty text"),
    (b"Hello world, far too short.\n", "at least 256"),
    (b"valid start \xff\xfe then junk" * 50, "offset 12"),
])
def test_bad_text(tmp_path, content, needle):
    t = tmp_path / "t.txt"
    t.write_bytes(content)
    out = tmp_path / "b.kldt"
    p = run_cli("base", "-f", t, "-c", 128, "--kl-divergence-base", out, check_rc=None)
    one_line_error(p, CorpusError.exit_code, "t.txt" if needle != "at least 256" else "", needle)
    assert not out.exists() and list(tmp_path.iterdir()) == [t]


def test_bad_flags(tmp_path):
    one_line_error(run_cli("base", "--format", "zip", check_rc=None), UsageError.exit_code, "--format")
    one_line_error(run_cli("base", "--engine", "nope", "-f", __file__, check_rc=None), UsageError.exit_code, "--engine")
    p = run_cli("base", "--no-such-flag", check_rc=None)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no-such-flag" in p.stderr
    p = run_cli("compare", "--kl-divergence-base", __file__, "-c", "abc", check_rc=None)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_not_a_base_file():
    p = run_cli("info", __file__, check_rc=None)
    one_line_error(p, BaseFileError.exit_code, "not a base file")
