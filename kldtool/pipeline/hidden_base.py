"""``base --store hidden``: the base phase stores final hidden states and the output head
(logitsfile/hidden.py) instead of log-prob rows, and checks on its first chunks that the file
replays the engine's own logits (the replay probe) before it goes on."""

from __future__ import annotations

from dataclasses import replace

from kldtool.codec import target_nll
from kldtool.errors import ReplayMismatch, UsageError
from kldtool.logitsfile.hidden import DTYPES, ReplayProbe, raw_array, torch_dtype

STORES = ("logprobs", "hidden")
DEFAULT_TOLERANCE = 1e-5  # nats of mean KLD between the engine's logits and the replayed ones
PROBE_CHUNKS = 2


def check_store(store: str, fmt: str, keep: int | None, tolerance: float = DEFAULT_TOLERANCE) -> None:
    """The storage flags on their own, before any model loads."""
    if store not in STORES:
        raise UsageError(f"--store {store!r}: expected one of {', '.join(STORES)}")
    if store != "hidden":
        return
    if fmt != "kldtool":
        raise UsageError("--store hidden: only kldtool's container holds hidden states; use --format kldtool")
    if keep:
        raise UsageError(f"--store hidden stores whole hidden states; drop --keep top-{keep}")
    if not tolerance > 0:
        raise UsageError(f"--replay-tolerance {tolerance:g}: must be above 0")


class HiddenStore:
    def __init__(self, engine, fmt: str, keep: int | None, tolerance: float = DEFAULT_TOLERANCE):
        check_store("hidden", fmt, keep, tolerance)
        self.head = engine.output_head()
        if self.head.dtype == "float64":  # a float64 reference run, stored at float32: its floor shows the cost
            b = self.head.bias
            self.head = replace(self.head, weight=self.head.weight.float(), bias=None if b is None else b.float())
        if self.head.dtype not in DTYPES:
            raise UsageError(f"--store hidden: the output head's dtype {self.head.dtype} cannot be stored "
                             f"({', '.join(DTYPES)})")
        self.dtype = torch_dtype(self.head.dtype)
        self.tolerance = tolerance
        self.probe = ReplayProbe(self.head, PROBE_CHUNKS)
        self.metadata = {"store": "hidden", "hidden": {"dim": int(self.head.weight.shape[1]),
                                                       "dtype": self.head.dtype}}

    def blocks(self, engine, windows):
        """(window number, stored hidden rows, float32 NLL of each target) block by block, the
        first chunks' blocks checked against their logits on the way."""
        probing = None
        for i, off, hidden, logits in engine.hidden_blocks(windows):
            w = windows[i]
            stored = hidden.to(self.dtype)
            if self.probe.chunks_left and probing != w.index:
                probing = w.index
                self.probe.chunks_left -= 1
                self.probe.chunks += 1
            if probing == w.index:
                self.probe.add(stored, logits)
            yield i, raw_array(stored), target_nll(logits, w.targets[off:off + len(logits)])
        self.check()

    def check(self) -> None:
        r = self.probe.result()
        if r["tokens"] and r["kld_mean"] > self.tolerance:
            raise ReplayMismatch(f"base: the stored hidden states replay the engine's logits with a mean KLD of "
                                 f"{r['kld_mean']:.3g} nats (max {r['kld_max']:.3g}, |Δlogit| up to "
                                 f"{r['max_abs_dlogit']:.3g}) over {r['tokens']} tokens, above --replay-tolerance "
                                 f"{self.tolerance:g}: no file written")

    def finish(self, writer) -> dict:
        writer.head = self.head
        return {"replay": self.probe.result() | {"tolerance": self.tolerance}}
