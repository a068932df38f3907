"""One streamed pass of the base model over the evaluation windows: at each unit, the quant's
version of that unit runs on the base model's own input to it, and its output is compared with
the base unit's output, then dropped. Nothing of a window outlives its forward, so the pass
holds one layer's activations beside the model, whatever the depth.

Per unit, over every position of every window (sums in float64):
- relative RMS: ||y_q - y|| / ||y|| over all output elements;
- cosine: the mean over positions of cos(y_q[t], y[t]);
- SQNR: 10 log10(||y||^2 / ||y_q - y||^2) dB.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from kldtool.attribute.units import Unit


@dataclass
class ErrorSums:
    ref2: float = 0.0
    diff2: float = 0.0
    cos: float = 0.0
    rows: int = 0

    def add(self, ref, got) -> None:
        import torch

        r = ref.reshape(-1, ref.shape[-1]).to(torch.float64)
        q = got.reshape(-1, got.shape[-1]).to(torch.float64)
        d = q - r
        self.ref2 += float((r * r).sum())
        self.diff2 += float((d * d).sum())
        self.cos += float(torch.nn.functional.cosine_similarity(q, r, dim=-1, eps=1e-300).sum())
        self.rows += r.shape[0]

    def result(self) -> dict:
        return {
            "rel_rms": math.sqrt(self.diff2 / self.ref2) if self.ref2 else math.nan,
            "cosine": self.cos / self.rows if self.rows else math.nan,
            "sqnr_db": 10 * math.log10(self.ref2 / self.diff2) if self.diff2 else math.inf,
            "positions": self.rows,
        }


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@contextmanager
def _hooks(units: list[Unit], sums: dict[str, ErrorSums]):
    import torch

    # A unit's own quant call runs through its module's hooks too, the hooks of every unit of that
    # module (a layer's experts share one): none of them may run inside it.
    busy = set()

    def make(unit: Unit):
        def hook(module, args, kwargs, output):
            if id(module) in busy:
                return None
            busy.add(id(module))
            try:
                params = {k: v.to(output_device(output)) for k, v in unit.full(unit.quant).items()}
                got = torch.func.functional_call(module, params, args, kwargs)
                sums[unit.name].add(_first(output), _first(got))
            finally:
                busy.discard(id(module))
            return None

        return hook

    handles = [u.module.register_forward_hook(make(u), with_kwargs=True) for u in units]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def output_device(output):
    return _first(output).device


def measure(model, units: list[Unit], windows, device: str = "cpu", progress=None) -> dict[str, dict]:
    """unit name -> its errors over ``windows`` (kldtool Windows), one window per forward."""
    import torch

    sums = {u.name: ErrorSums() for u in units}
    with torch.inference_mode(), _hooks(units, sums):
        for i, w in enumerate(windows):
            ids = torch.from_numpy(np.asarray(w.tokens, dtype=np.int64))[None].to(device)
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            if progress:
                progress(i + 1, len(windows))
    return {u.name: sums[u.name].result() for u in units}
