"""A kldtool command stopped by a signal at a chosen point of its output: how the crash-safety
tests (resume) interrupt a run."""

import os
import re
import signal
import subprocess
import sys


def run_until(args, pattern: str, sig: int):
    """Start kldtool, send ``sig`` once ``pattern`` appears on stdout; returns (rc, stdout, stderr)."""
    # SIGINT back to its default in the child: a CI started as a background job of a shell
    # without job control has it ignored, and Python would then never see Ctrl-C.
    p = subprocess.Popen(
        [sys.executable, "-m", "kldtool", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out = b""
    rx = re.compile(pattern.encode(), re.M)
    while not rx.search(out):
        block = os.read(p.stdout.fileno(), 4096)
        if not block:
            break
        out += block
    p.send_signal(sig)
    rest, err = p.communicate(timeout=120)
    return p.returncode, (out + rest).decode(), err.decode()
