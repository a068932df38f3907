"""The CI rule "a skip fails the run" holds for a module skipped at collection (issue 78): a
real pytest, in a subprocess, runs a tiny test directory whose module does
``pytest.importorskip("ray")`` while a shadowing ``ray`` package fails to import (a dependency
of its own missing, as a half-installed vLLM or Ray fails), with a shared/ present (a stand-in
laid out as CI's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

TESTS = Path(__file__).resolve().parent


def _layout(tmp: Path) -> tuple[Path, dict]:
    shared = tmp / "shared"
    (shared / "fixtures" / "llamacpp").mkdir(parents=True)
    (shared / "data" / "wikitext-2").mkdir(parents=True)
    (shared / "data" / "wikitext-2" / "wiki.test.txt").write_text(" = stand-in = \n")
    shadow = tmp / "shadow" / "ray"
    shadow.mkdir(parents=True)
    # A dependency of its own missing: ModuleNotFoundError, which importorskip turns into a skip
    # (pytest 9 lets any other ImportError fail the collection by itself).
    (shadow / "__init__.py").write_text("import a_dependency_this_ray_lacks  # noqa: F401\n")
    suite = tmp / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        "from helpers.skip_rule import pytest_collectreport, pytest_runtest_logreport, "
        "pytest_sessionfinish, pytest_terminal_summary  # noqa: F401\n"
    )
    (suite / "test_needs_ray.py").write_text(
        "import pytest\nray = pytest.importorskip('ray')\n\ndef test_cluster():\n    assert ray\n"
    )
    (suite / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    env = dict(os.environ, KLDTOOL_SHARED=str(shared), PYTHONPATH=os.pathsep.join([str(tmp / "shadow"), str(TESTS)]))
    env.pop("KLDTOOL_EXPECTED_SKIPS", None)
    return suite, env


def _pytest(suite: Path, env: dict, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(suite)]
    return subprocess.run([*cmd, *args, str(suite)], capture_output=True, text=True, env=env, cwd=suite, timeout=120)


# Under xdist the same rule costs a two-worker pytest start: the full suite runs that case.
@pytest.mark.parametrize(
    "workers", [[], pytest.param(["-n", "2"], marks=pytest.mark.full_tier)], ids=["one-process", "xdist"]
)
def test_a_module_skipped_at_import_fails_the_run_naming_it(tmp_path, workers):
    suite, env = _layout(tmp_path)
    p = _pytest(suite, env, *workers)
    assert p.returncode == pytest.ExitCode.TESTS_FAILED, p.stdout[-2000:]
    assert "skips that fail this run" in p.stdout and "test_needs_ray.py" in p.stdout, p.stdout[-2000:]
    assert "1 passed" in p.stdout


def test_a_named_expected_skip_passes(tmp_path):
    suite, env = _layout(tmp_path)
    p = _pytest(suite, dict(env, KLDTOOL_EXPECTED_SKIPS="test_needs_ray.py"))
    assert p.returncode == 0, p.stdout[-2000:]
