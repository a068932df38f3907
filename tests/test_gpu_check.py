"""benchmarks/gpu_check.sh, the one script a session lent a GPU runs, in its --dry-run form:
the same benchmark scripts on the CPU at toy sizes (the Triton kernel under its interpreter),
so they still run, and still print every row and target, the day a GPU is there."""

import os
import subprocess
import sys

import pytest

from conftest import HAVE_SHARED, ROOT, interpreted_triton

# Its one test takes about a minute: first among the one-test files xdist hands out last, so a
# run does not end on it while the other worker idles.
pytestmark = pytest.mark.long_module


def test_the_gpu_check_runs_every_step_at_toy_sizes(tmp_path):
    results = tmp_path / "rows.md"
    p = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=900,
        # the script sets TRITON_INTERPRET itself; its Python processes get the interpreter's shortcut
        env=os.environ
        | {"PYTHON": sys.executable, "RESULTS": str(results), "PYTHONPATH": interpreted_triton()["PYTHONPATH"]},
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = results.read_text()
    for what in (
        "GPU reducer, 32 rows x 4096 vocab",
        "GPU reducer vs Llama-tiny-shaped forward",
        "transformers compare vs bare forward+log_softmax (random Llama-3-tiny shape",
        "base-row feed alone vs bare forward",
        "transformers compare from a hidden-state base",
        "base phase, kldtool container vs llama.cpp raw",
    ):
        assert what in rows, what
    # The kernel's records agree with float64 and with the torch reducer at these sizes too.
    assert "equal to the torch reducer's: same_top, top5, top10, top1_q, top1_base" in p.stdout
    assert "(target < 0.05)" in rows and "(target >= 0.50)" in rows
    # The llama.cpp section: -ngl 99 on this CPU build prints llama-perplexity's own lines (its
    # printout in shared/'s fixtures; a clone without them says it skipped).
    if HAVE_SHARED:
        assert "compare --engine llamacpp -ngl 99 on a CPU build" in rows and "printed lines identical: True" in rows
    else:
        assert "llamacpp_gpu --dry-run: skipped" in p.stdout


@pytest.mark.quick
def test_every_flag_the_gpu_check_passes_is_one_its_scripts_take():
    """The quick tier's guard against the GPU script rotting: every benchmark script it calls
    exists and its --help lists each flag the script passes it, in both modes."""
    import re

    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    calls = re.findall(r'"\$PY" (benchmarks/\w+\.py)((?:[^\n]|\\\n)*)', script)
    assert len(calls) == 7, calls
    for path, args in calls:
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", args))
        command = re.match(r"\s*([a-z]+)\b", args)  # a subcommand's flags are in its own help
        help_args = [command.group(1), "--help"] if command else ["--help"]
        p = subprocess.run([sys.executable, str(ROOT / path), *help_args], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        missing = [f for f in flags if f not in p.stdout]
        assert not missing, (path, missing)
