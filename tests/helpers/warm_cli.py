"""conftest.run_cli's commands, run in forks of one warm interpreter per test worker
(cli_zygote.py) instead of a fresh ``python -m kldtool`` that imports torch and transformers
again for every command.

A warm interpreter runs only commands of the environment it started with: torch, OpenMP and
the Hugging Face hub read theirs when imported. A module's commands with an environment of their
own (a hub cache, a server's client settings) get a warm interpreter of that environment from
the second such command on; a worker keeps at most POOL of them, the least recently used
closing first.

A command goes to a fresh interpreter instead
- the first time its environment is seen (a one-off would not repay the import);
- when another thread of the test is already running a command through the pool;
- when KLDTOOL_TEST_FRESH_PROCESSES is set, which sends every command there.
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
POOL = 3  # warm interpreters per worker, about 0.4 GB each


def _key(env: dict) -> frozenset:
    return frozenset((k, v) for k, v in env.items() if k not in PER_TEST)


class _Zygote:
    def __init__(self, env: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        if self.proc.stdout.readline() != "ready\n":
            raise RuntimeError(f"{ZYGOTE.name} did not start (exit code {self.proc.wait()})")

    def run(self, argv: list[str], env: dict) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="kldtool-cli-") as d:
            out, err = Path(d, "stdout"), Path(d, "stderr")
            job = {"argv": argv, "cwd": os.getcwd(), "env": env, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
            if not reply:
                raise RuntimeError(f"{ZYGOTE.name} exited while running kldtool {' '.join(argv)}")
            rc = json.loads(reply)["rc"]
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "kldtool", *argv], rc, out.read_text(), err.read_text()
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            self.proc.wait()


class WarmCli:
    def __init__(self) -> None:
        self._pool: dict[frozenset, _Zygote] = {}  # least recently used first
        self._seen: set[frozenset] = set()
        self._lock = threading.Lock()
        atexit.register(self.close)

    def run(self, argv: list[str], env: dict) -> subprocess.CompletedProcess | None:
        """The command's completed process, or None where it must run in a fresh interpreter."""
        if os.environ.get("KLDTOOL_TEST_FRESH_PROCESSES") or not self._lock.acquire(blocking=False):
            return None
        try:
            key = _key(env)
            zygote = self._pool.pop(key, None)
            if zygote is None or not zygote.alive():
                # The test process's own environment is warmed at once; any other from its second command.
                if key != _key(os.environ) and key not in self._seen:
                    self._seen.add(key)
                    return None
                if len(self._pool) >= POOL:
                    self._pool.pop(next(iter(self._pool))).close()
                zygote = _Zygote(env)
            self._pool[key] = zygote
            return zygote.run(argv, env)
        finally:
            self._lock.release()

    def close(self) -> None:
        for zygote in self._pool.values():
            zygote.close()
        self._pool.clear()
