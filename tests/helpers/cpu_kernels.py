"""What the CPU running the tests does with float32 matrix products, asked of torch itself, so a
tolerance that depends on it is derived from this machine rather than from the one it was
first measured on (docs/testing.md, "Tolerances that depend on the CPU").

On an Intel Xeon (AVX-512) torch's float32 ``linear`` gives a row the same bits however many
rows share the call. On an AMD EPYC (Zen 4) MKL takes other kernels for a call of a few rows:
a row computed alone, or in a batch of 7, differs in its last bits from the same row in a
batch of 63. A window scored in another batch composition (a run resumed in turns, a server
batching other requests beside it, lm-eval's batches against kldtool's) then moves by about
1e-7 relative, and an assertion of bitwise equality, or of 1e-7, holds on one CPU and not the
other.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def float32_rows_depend_on_the_batch() -> bool:
    """Whether a float32 ``linear`` row's result depends on how many rows share the call, on
    shapes of the built-in model's (576 wide; its 1,536-wide MLP and 49,152-wide head)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 576, generator=g)
    for out in (1536, 49152):
        w = torch.randn(out, 576, generator=g)
        full = torch.nn.functional.linear(x, w)
        if not all(torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]) for m in (1, 7, 63, 128, 353)):
            return True
    return False


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
