"""Where shared/ is present (as in CI) every test must run: a skip there means a test silently
stopped checking something, and a run with one fails, listing it. That holds for a test that
skips and for a whole module skipped while it is collected (``pytest.importorskip("vllm")``
at its top: a broken vLLM or Ray install would otherwise drop the module and pass).
KLDTOOL_EXPECTED_SKIPS names the skips a machine may have (comma-separated pieces of their
reasons or node ids). tests/conftest.py takes these hooks as its own; tests/test_skip_rule.py
runs them on a module that fails to import."""

from __future__ import annotations

import os

import pytest

from helpers.shared_data import HAVE_SHARED

EXPECTED_SKIPS = [s.strip() for s in os.environ.get("KLDTOOL_EXPECTED_SKIPS", "").split(",") if s.strip()]
UNEXPECTED_SKIPS: list[str] = []


def _note(report) -> None:
    if not (HAVE_SHARED and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(s in reason or s in report.nodeid for s in EXPECTED_SKIPS):
        UNEXPECTED_SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report):
    _note(report)


def pytest_collectreport(report):
    """A module skipped at import is a collection report, never a test's (under xdist the
    controller gets every skipped collection report its workers make)."""
    _note(report)


def pytest_terminal_summary(terminalreporter, config):
    if UNEXPECTED_SKIPS and not hasattr(config, "workerinput"):
        terminalreporter.section("skips that fail this run (shared/ is present)", red=True)
        for line in UNEXPECTED_SKIPS:
            terminalreporter.line(line)


def pytest_sessionfinish(session, exitstatus):
    if UNEXPECTED_SKIPS and exitstatus == 0 and not hasattr(session.config, "workerinput"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
