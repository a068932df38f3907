"""Base rows built straight from codes (not through the encoder under test), and random cases."""

import os

import numpy as np

from kldtool.codec import row_width

SCALE = np.float32(16) / np.float32(65535)
# Rows of a random case: test_reducer_variants asks for fewer under Triton's interpreter, where
# each row is a program run in Python (the same code paths, a third of the time).
ROWS = int(os.environ.get("KLDTOOL_TEST_RANDOM_ROWS", "300"))


def make_base_rows(codes: np.ndarray, scale=SCALE, min_log_prob=None) -> np.ndarray:
    """uint16 rows built directly from codes (not through the encoder under test)."""
    n, v = codes.shape
    rows = np.zeros((n, row_width(v)), dtype=np.uint16)
    if min_log_prob is None:
        b = scale * codes.astype(np.float64)
        min_log_prob = -(b.max(1) + np.log(np.exp(b - b.max(1)[:, None]).sum(1)))
    head = np.stack([np.full(n, scale, np.float32), np.asarray(min_log_prob, np.float32) * np.ones(n, np.float32)], 1)
    rows[:, :4] = head.astype(np.float32).view(np.uint16)
    rows[:, 4 : 4 + v] = codes
    return rows


def random_case(seed, n=None, v=777, noise=0.7):
    n = ROWS if n is None else n
    rng = np.random.default_rng(seed)
    base_logits = rng.standard_normal((n, v)) * 3
    codes = np.clip(np.rint((base_logits - base_logits.max(1, keepdims=True) + 16) / SCALE), 0, 65535).astype(np.uint16)
    q = (base_logits + noise * rng.standard_normal((n, v))).astype(np.float32)
    targets = rng.integers(0, v, n)
    return q, make_base_rows(codes), targets
