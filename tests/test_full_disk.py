"""A write that fails part-way (full disk, a file-size limit) ends in one line and exit code 7,
and leaves no file that looks complete: the chunks written so far stay in the partial file."""

import resource
import signal
import subprocess
import sys

import pytest

from conftest import WIKI
from kldtool.errors import OutputError

pytestmark = pytest.mark.quick

ARGS = ["base", "-f", WIKI, "-c", 128, "--chunks", 8, "--format", "llamacpp"]  # ~50 MB of rows


def run_base(model, out, preexec=None):
    return subprocess.run(
        [sys.executable, "-m", "kldtool", *map(str, ARGS), "-m", str(model), "--kl-divergence-base", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=preexec,
    )


def last_line(p):
    assert "Traceback" not in p.stderr
    return p.stderr.strip().splitlines()[-1]


@pytest.mark.full_tier
def test_file_size_limit(q4_1_gguf, tmp_path):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # make the write fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 << 20, 20 << 20))

    out = tmp_path / "b.kld"
    p = run_base(q4_1_gguf, out, limit)
    assert p.returncode == OutputError.exit_code, p.stderr
    assert "b.kld" in last_line(p) and "File too large" in last_line(p)
    assert not out.exists()


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        mounted = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True
            ).returncode
            == 0
        )
    except OSError:  # no mount binary
        mounted = False
    if not mounted:
        pytest.skip("cannot mount a small tmpfs here (needs root): a full disk (ENOSPC) goes untested")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_disk_full(q4_1_gguf, small_disk):
    out = small_disk / "b.kld"
    p = run_base(q4_1_gguf, out)
    assert p.returncode == OutputError.exit_code, p.stderr
    line = last_line(p)
    assert "disk full" in line and "--resume" in line and ".b.kld.partial" in line
    assert not out.exists()
    assert (small_disk / ".b.kld.partial").exists()  # the complete chunks, for --resume once there is room
