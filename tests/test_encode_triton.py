"""The CUDA row encoder (codec/rows_triton.py) gives encode_torch's codes, code for code: run by
Triton's CPU interpreter in a fresh process (TRITON_INTERPRET only takes effect before triton is
first imported), over random fp32 and bf16-valued rows, an odd and a 70,000-entry vocabulary,
and rows with a scale of 0, an -inf entry, ties at half a step and a clamped tail, for both
codecs at clamp windows of 16 and 32 nats."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import interpreted_triton

pytestmark = pytest.mark.quick

HERE = Path(__file__).resolve().parent


def _check(*cases: str) -> list[str]:
    p = subprocess.run(
        [sys.executable, str(HERE / "helpers" / "encode_triton_check.py"), *cases],
        env=os.environ | interpreted_triton(HERE.parent),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert all(line.split(": ")[1].startswith("same") for line in lines), p.stdout
    return lines


def test_the_edge_rows_encode_alike():
    """The edit loop's share: the awkward rows alone (a scale of 0, -inf, ties, a clamped tail)."""
    assert len(_check("edge rows")) == 4


@pytest.mark.full_tier
def test_triton_encoder_equals_encode_torch():
    """The rest of the cases: random fp32 and bf16-valued rows, a 70,000-entry vocabulary."""
    assert len(_check("random fp32", "bf16 values", "wide")) == 12
