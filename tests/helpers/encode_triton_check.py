"""Run with TRITON_INTERPRET=1 (set before triton is imported): the Triton row encoder against
encode_torch on the CPU, code for code, over awkward rows; prints one line per case. Arguments:
the names of the cases to run (all of them without)."""

import sys

import numpy as np
import torch

from kldtool.codec.rows import encode_torch
from kldtool.codec.rows_triton import encode_triton


def cases():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 3001)) * 4).astype(np.float32)  # odd vocabulary: the pad slot
    yield "random fp32", x
    yield "bf16 values", torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    y = x.copy()
    y[0] = 1.5  # all equal: scale 0
    y[1, 7] = 60.0  # one entry holds almost all the mass (the grid's tail rule)
    y[2, 11] = -np.inf
    y[3] = np.round(y[3] * 4096) / 4096  # on the grid itself: ties at .5 of a step
    y[4, :] = -30.0
    y[4, 100] = -2.0  # a row clamped everywhere but one entry
    yield "edge rows", y
    yield "wide", (rng.standard_normal((6, 70000)) * 3).astype(np.float32)


if __name__ == "__main__":
    for name, x in cases():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        t = torch.from_numpy(x)
        for codec in ("llamacpp", "grid"):
            for clamp in (16.0, 32.0):
                a, ma = encode_torch(t, codec, clamp)
                b, mb = encode_triton(t, codec, clamp)
                same = torch.equal(a, b) and torch.equal(ma, mb)
                print(f"{name} {codec} {clamp}: {'same' if same else 'DIFFERENT'} ({int((a != b).sum())} codes differ)")
