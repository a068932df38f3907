"""Every reducer against the same float64 references. On the CPU the default is the compiled
numba loop (reduce/numba_cpu.py); here the reference suites run again in a fresh process with
KLDTOOL_REDUCER forcing each other one: the torch ops (what a GPU without Triton runs), and the
one-pass Triton kernel (the CUDA default) executed by Triton's CPU interpreter. A fresh process
because TRITON_INTERPRET only takes effect if set before triton is first imported."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import interpreted_triton
from helpers.vocab_models import SHAPES

HERE = Path(__file__).resolve().parent
SUITES = ["test_stats_reference.py", "test_extra_metrics.py"]
VARIANTS = {
    "torch": ({"KLDTOOL_REDUCER": "torch"}, [], 19),
    # The kernel computes every record, the top-5/10 overlaps from its lanes' candidates
    # included. Its interpreter runs each row as a program in Python: one seed of each random
    # suite runs, on 100 rows (the adversarial rows, ties and tail tiles all do), and of the
    # vocabularies users quantize the one least aligned to a tile (151,936 = 593.5 x 256; 15 s
    # for its 12 rows, 100 s for all five), which keeps CI within its budget.
    "triton": (
        {"KLDTOOL_REDUCER": "triton", "KLDTOOL_TEST_RANDOM_ROWS": "100", **interpreted_triton()},
        [
            "test_stats_reference.py::test_random_rows_match_float64_reference[1]",
            "test_stats_reference.py::test_random_rows_match_float64_reference[2]",
            "test_extra_metrics.py::test_random_rows_match_float64_reference[1-0.05]",
            *(
                f"test_stats_reference.py::test_the_vocabularies_users_quantize[{v}]"
                for v in {v for _, v, _ in SHAPES.values()} - {151_936}
            ),
        ],
        12,
    ),
}


def _suites(env: dict, args: list[str]) -> str:
    """The reference suites run again in a fresh process under ``env``; their output."""
    # what the records feed (percentiles, sums merged, summaries, bootstrap) is the same code
    # whichever reducer made them: only the reducers' own tests run again
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-k"]
    p = subprocess.run(
        [*cmd, "not percentile and not bootstrap and not summaries and not shards", *args],
        env=os.environ | env,
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-4000:]
    return p.stdout


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_suites_through(name):
    env, skipped, least = VARIANTS[name]
    out = _suites(env, [*(str(HERE / f) for f in SUITES), *(f"--deselect=tests/{node}" for node in skipped)])
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= least and "skipped" not in out, out[-2000:]


@pytest.mark.quick
def test_the_torch_reducer_on_the_adversarial_rows():
    """The quick tier's taste of the above: the torch reducer (what a GPU without Triton runs)
    named as the one under test, and on both suites' adversarial rows against float64."""
    out = _suites({"KLDTOOL_REDUCER": "torch"}, [str(HERE / f) + "::test_adversarial_rows" for f in SUITES] + [
        str(HERE / "test_stats_reference.py::test_the_reducer_under_test")])  # fmt: skip
    assert "3 passed" in out and "skipped" not in out, out[-2000:]
