"""e^x for float32 x as compiled loops need it: evaluated in float64 and rounded to float32
(< 1e-8 relative before the rounding, as near to libm's expf as llama.cpp's float64 sums of
float32 terms need), from a degree-7 series and 2^k made from its bits, so LLVM vectorizes the
loops that call it (a libm call per entry would not vectorize). Shared by the CPU reducer and the
compiled encoder of replayed rows."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def exp_f64(x):
    y = min(max(np.float64(x), -700.0), 700.0)  # float32's underflow to 0 and overflow to inf stay
    k = np.rint(y * 1.4426950408889634)
    r = y - k * 0.6931471805599453  # |r| <= ln2 / 2: the series to r^7 leaves < 5e-9
    poly = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (1 / 720 + r * (1 / 5040)))))))
    return np.float32(poly * np.int64((np.int64(k) + np.int64(1023)) << np.int64(52)).view(np.float64))
