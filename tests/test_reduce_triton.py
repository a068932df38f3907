"""The one-pass Triton reducer (the CUDA default) against the same float64 references as the
torch reducer: test_stats_reference.py runs again in a fresh process with every reduction
routed through the kernel, executed by Triton's CPU interpreter. A fresh process because
TRITON_INTERPRET only takes effect if set before triton is first imported."""

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_reference_suite_through_the_triton_kernel():
    env = os.environ | {"KLDTOOL_REDUCER": "triton", "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not percentile",
                        str(HERE / "test_stats_reference.py")], env=env, capture_output=True, text=True,
                       cwd=HERE.parent, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:]
    passed = re.search(r"(\d+) passed", p.stdout)
    assert passed and int(passed.group(1)) >= 8 and "skipped" not in p.stdout, p.stdout[-2000:]
