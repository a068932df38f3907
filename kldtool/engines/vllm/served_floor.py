"""A served model's own repeatability, measured during a compare: the first windows the run
scored are scored again at its end, in a batch of their own, and their records set beside the
first scoring's.

A server batches a client's windows with whatever else it serves at that moment. Kernels that
choose their reduction order by the batch's shape (bf16 matmuls on most CPUs and GPUs) then give
the same window slightly different logits from one batch to the next, so a served compare moves
with other clients' traffic. The difference between two scorings of the same windows is that
movement, measured on this server, now: a compare's differences of the same size say nothing
about the quant. A float32 server, or one in vLLM's batch-invariant mode, gives 0.
"""

from __future__ import annotations

import threading
import time

import numpy as np

REPEATS = 2  # windows scored twice: 2 of a run's windows, the cost the line states


class ServedFloor:
    def __init__(self, repeats: int = REPEATS):
        self.repeats = repeats
        self.kept: list = []  # (window, its first records)
        self._lock = threading.Lock()  # a schedule's calls may return side by side

    def keep(self, windows, records) -> None:
        with self._lock:
            for w, r in zip(windows, records):
                if len(self.kept) < self.repeats:
                    self.kept.append((w, r))

    def measure(self, score, windows_total: int) -> dict | None:
        """``score(windows)`` -> their records, scored again now; None where nothing was kept."""
        if not self.kept:
            return None
        t = time.monotonic()
        windows = [w for w, _ in self.kept]
        again = score(windows)
        first = {
            f: np.concatenate([np.asarray(getattr(r, f), np.float64) for _, r in self.kept]) for f in ("nll", "kld")
        }
        second = {f: np.concatenate([np.asarray(getattr(r, f), np.float64) for r in again]) for f in ("nll", "kld")}
        d_nll, d_kld = second["nll"] - first["nll"], np.abs(second["kld"] - first["kld"])
        floor = {
            "windows": [int(w.index) for w in windows],
            "tokens": int(d_nll.size),
            "of_windows": int(windows_total),
            "seconds": round(time.monotonic() - t, 3),
            "ln_ppl_q_diff": float(abs(d_nll.mean())),
            "nll_max_abs_diff": float(np.abs(d_nll).max()),
            "kld_mean_abs_diff": float(d_kld.mean()),
            "kld_max_abs_diff": float(d_kld.max()),
            "identical": bool(not d_nll.any() and not d_kld.any()),
        }
        return floor | {"summary": floor_line(floor)}


def floor_line(floor: dict) -> str:
    return (
        f"compare: served noise floor: {len(floor['windows'])} of {floor['of_windows']} windows "
        f"({floor['tokens']} positions) scored again at the end in {floor['seconds']:.1f} s: "
        f"|Δ ln PPL(Q)| {floor['ln_ppl_q_diff']:.3g}, mean |ΔKLD| {floor['kld_mean_abs_diff']:.3g} "
        f"(max {floor['kld_max_abs_diff']:.3g}); differences of this size are the server's, not the quant's"
    )


def server_note(info: dict) -> str:
    """What the served numbers depend on, for the run's header line."""
    invariant = info.get("batch_invariant")
    mode = ", batch-invariant" if invariant else ""
    return f" (server: {info.get('dtype', '?')}, vLLM {info.get('vllm', '?')}{mode})"
