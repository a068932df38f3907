"""What a run writes to stderr wherever stderr goes: to a file, plain lines and no carriage
returns; on a terminal (a real pseudo-terminal), rich's live bar, ending cleanly; and the
results on stdout the same in every mode. Each command runs in a fresh ``python -m kldtool``,
as a user starts it, so what the process imports first is what a user's does."""

import os
import pty
import re
import subprocess
import sys

import pytest

from conftest import run_cli

pytestmark = pytest.mark.quick

WINDOWS = 4


@pytest.fixture(scope="module")
def small_base(q4_1_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("progress") / "b.kldt"
    run_cli("base", "-m", q4_1_gguf, "-c", 128, "--chunks", WINDOWS, "--kl-divergence-base", out)
    return out


def _compare_args(small_base, q4_1_gguf) -> list[str]:
    return ["compare", "-m", str(q4_1_gguf), "--kl-divergence-base", str(small_base), "-b", "128"]


def _fresh(args, tmp_path, **env) -> tuple[subprocess.CompletedProcess, bytes]:
    """``kldtool ARGS`` with stderr sent to a file, as ``2> err.txt`` does."""
    err = tmp_path / f"err-{len(list(tmp_path.glob('err-*')))}.txt"
    with open(err, "wb") as f:
        p = subprocess.run(
            [sys.executable, "-m", "kldtool", *args], stdout=subprocess.PIPE, stderr=f, env=dict(os.environ, **env)
        )
    return p, err.read_bytes()


@pytest.mark.full_tier
def test_stderr_in_a_file_holds_plain_lines_and_stdout_is_unchanged(small_base, q4_1_gguf, tmp_path):
    args = _compare_args(small_base, q4_1_gguf)
    p, err = _fresh(args, tmp_path, KLDTOOL_PROGRESS_SECONDS="0")
    assert p.returncode == 0, err.decode()
    assert b"\r" not in err and b"\x1b" not in err  # no redraws, no terminal codes
    lines = err.decode().splitlines()
    steps = [l for l in lines if re.fullmatch(rf"compare: [1-3]/{WINDOWS} windows \(\d+ %\), .+, ETA \d+:\d\d", l)]
    assert len(steps) == WINDOWS - 1, lines
    assert re.fullmatch(rf"compare: {WINDOWS}/{WINDOWS} windows in \d+:\d\d", lines[-1]), lines
    # The default interval writes no line for a run this short; none writes none at all.
    quiet, quiet_err = _fresh(args, tmp_path)
    silent, silent_err = _fresh([*args, "--progress", "none"], tmp_path, KLDTOOL_PROGRESS_SECONDS="0")
    for e in (quiet_err, silent_err):
        assert b"windows (" not in e and b"windows in" not in e, e.decode()
    assert p.stdout == quiet.stdout == silent.stdout and b"Same top p" in p.stdout


@pytest.mark.full_tier
def test_a_terminal_gets_a_live_bar_that_ends_cleanly(small_base, q4_1_gguf):
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the terminal
        env = dict(os.environ, COLUMNS="120", TERM="xterm-256color")
        env.pop("KLDTOOL_PROGRESS", None)
        os.execve(sys.executable, [sys.executable, "-m", "kldtool", *_compare_args(small_base, q4_1_gguf)], env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    raw = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, raw
    assert "\x1b[?25l" in raw and raw.count("\x1b[?25l") == raw.count("\x1b[?25h"), raw  # the cursor is back
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)  # what the terminal shows, without its codes
    assert re.search(rf"compare .*{WINDOWS}/{WINDOWS} windows +100%", screen), screen
    # The chunk lines went above the bar, and the statistics come after it, whole.
    assert screen.index("====== Perplexity statistics ======") > screen.rindex(f"{WINDOWS}/{WINDOWS} windows")
    assert re.search(rf" {WINDOWS} +\d+\.\d+ ± ", screen) and "\nSame top p: 100.000 ± 0.000 %" in screen


def test_bad_progress_settings_are_one_line_usage_errors(small_base, q4_1_gguf, tmp_path):
    args = _compare_args(small_base, q4_1_gguf)
    for extra, env, said in (
        (["--progress", "fancy"], {}, "--progress 'fancy': expected one of auto, bar, lines, none"),
        ([], {"KLDTOOL_PROGRESS": "loud"}, "KLDTOOL_PROGRESS='loud': expected one of auto, bar, lines, none"),
    ):
        p, err = _fresh([*args, *extra], tmp_path, **env)
        assert p.returncode == 2 and err.decode().strip().splitlines() == [f"kldtool: error: {said}"]


def test_kldtool_alone_lists_every_command_in_the_order_a_user_meets_them():
    from kldtool.cli.app import SUMMARY, app

    p = subprocess.run([sys.executable, "-m", "kldtool"], capture_output=True, text=True)
    listed = (p.stdout + p.stderr).split("Commands:", 1)[1].strip().splitlines()
    names = [line.split()[0] for line in listed]
    registered = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert names[:3] == ["base", "compare", "report"] and set(names) == registered == set(SUMMARY)
    for line, name in zip(listed, names):
        assert line.split(None, 1)[1] == SUMMARY[name]  # whole, not cut at the terminal's width
