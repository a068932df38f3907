"""The llama.cpp compare path stays on numpy: llama.cpp's logits buffer and the base file's
rows go to the compiled reducer as arrays. Importing torch alone would cost a short compare
seconds (docs/benchmarks.md). The command runs in a fresh interpreter: a warm one (run_cli's)
may have imported torch already, and would pass whatever the command imports."""

import os
import subprocess
import sys

import pytest

from conftest import llamacpp_reference, chunk_table_lines

pytestmark = pytest.mark.quick


def test_llamacpp_compare_never_imports_torch(q4_1_gguf, fixture_base):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kldtool",
            "compare",
            "--kl-divergence-base",
            fixture_base,
            "-m",
            q4_1_gguf,
            "--chunks",
            "1",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "kldtool.reduce.numba_cpu" in imported and "llama_cpp" in imported
    assert "torch" not in imported
    # the same first chunk as llama-perplexity's own printed table
    assert chunk_table_lines(p.stdout)[0] == chunk_table_lines(llamacpp_reference("compare-self.txt").read_text())[0]
