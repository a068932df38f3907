"""conftest.run_cli's commands, run in forks of one warm interpreter per test worker
(cli_zygote.py) instead of a fresh ``python -m kldtool`` that imports torch and transformers
again for every command.

A command goes to a fresh interpreter instead where the fork could differ from one:
- its environment differs from the one the warm interpreter started with (torch, OpenMP and
  the Hugging Face hub read theirs when imported);
- another thread of the test is already running a command through it;
- KLDTOOL_TEST_FRESH_PROCESSES is set, which sends every command there.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ZYGOTE = Path(__file__).with_name("cli_zygote.py")
PER_TEST = {"PYTEST_CURRENT_TEST"}  # pytest's own note of the running test, not an input


def _same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in PER_TEST} == {k: v for k, v in b.items() if k not in PER_TEST}


class WarmCli:
    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._env: dict = {}
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _start(self) -> None:
        self._env = dict(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self._env
        )
        if self._proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"{ZYGOTE.name} did not start (exit code {self._proc.wait()})")

    def run(self, argv: list[str], env: dict) -> subprocess.CompletedProcess | None:
        """The command's completed process, or None where it must run in a fresh interpreter."""
        if os.environ.get("KLDTOOL_TEST_FRESH_PROCESSES") or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            if not _same(env, self._env):
                return None
            with tempfile.TemporaryDirectory(prefix="kldtool-cli-") as d:
                out, err = Path(d, "stdout"), Path(d, "stderr")
                job = {"argv": argv, "cwd": os.getcwd(), "env": env, "out": str(out), "err": str(err)}
                self._proc.stdin.write(json.dumps(job) + "\n")
                self._proc.stdin.flush()
                reply = self._proc.stdout.readline()
                if not reply:
                    raise RuntimeError(f"{ZYGOTE.name} exited while running kldtool {' '.join(argv)}")
                rc = json.loads(reply)["rc"]
                return subprocess.CompletedProcess(
                    [sys.executable, "-m", "kldtool", *argv], rc, out.read_text(), err.read_text()
                )
        finally:
            self._lock.release()

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait()
