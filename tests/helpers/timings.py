"""Where the suite's time goes, per test file: each file's setup, call and teardown seconds
summed (under xdist's loadfile a file runs on one worker, so this is its wall time there).
The terminal summary names any file over BUDGET_S, a warning to act on and never a failure;
``KLDTOOL_TIMINGS=FILE`` (``scripts/test.sh --timings``) also writes every file's seconds, and
the setup seconds its tests spent on fixtures, as JSON to FILE. tests/conftest.py takes these
hooks as its own."""

from __future__ import annotations

import json
import os
from collections import defaultdict

BUDGET_S = 300.0  # a file over five minutes is named in every run's summary

_seconds: dict[str, float] = defaultdict(float)
_setup: dict[str, float] = defaultdict(float)
_tests: dict[str, int] = defaultdict(int)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _seconds[path] += report.duration
    if report.when == "setup":
        _setup[path] += report.duration
    elif report.when == "call":
        _tests[path] += 1


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not _seconds:
        return
    over = {p: s for p, s in _seconds.items() if s > BUDGET_S}
    if over:
        terminalreporter.section("test files over their 5-minute budget (docs/testing.md)", yellow=True)
        for p, s in sorted(over.items(), key=lambda x: -x[1]):
            terminalreporter.line(f"{s:8.1f} s  {p}")
    out = os.environ.get("KLDTOOL_TIMINGS")
    if out:
        rows = {
            p: {"seconds": round(s, 2), "setup_s": round(_setup[p], 2), "tests": _tests[p]}
            for p, s in sorted(_seconds.items(), key=lambda x: -x[1])
        }
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"total_s": round(sum(_seconds.values()), 2), "files": rows}, f, indent=1)
        terminalreporter.line(f"per-file timings written to {out}")
