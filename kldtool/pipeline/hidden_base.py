"""``base --store hidden``: the base phase stores final hidden states and the output head
(logitsfile/hidden.py) instead of log-prob rows, and checks on its first chunks that the file
replays the engine's own logits (the replay probe) before it goes on."""

from __future__ import annotations

from dataclasses import replace

from kldtool.codec import target_nll
from kldtool.errors import ReplayMismatch, UsageError
from kldtool.logitsfile.header import CONTAINER
from kldtool.logitsfile.hidden import DTYPES, raw_array, torch_dtype
from kldtool.logitsfile.replay import ReplayProbe
from kldtool.pipeline.engine_modes import head_source, with_hidden_states

STORES = ("logprobs", "hidden")
HEADS = ("inline", "external")
DEFAULT_TOLERANCE = 1e-5  # nats of mean KLD between the engine's logits and the replayed ones
PROBE_CHUNKS = 2
PROBE_ROWS = 128  # per probed window, where the engine's logits must leave its workers for the probe


def check_store(
    store: str, fmt: str, keep: int | None, tolerance: float = DEFAULT_TOLERANCE, head: str = "inline"
) -> None:
    """The storage flags on their own, before any model loads."""
    if store not in STORES:
        raise UsageError(f"--store {store!r}: expected one of {', '.join(STORES)}")
    if head not in HEADS:
        raise UsageError(f"--head {head!r}: expected one of {', '.join(HEADS)}")
    if store != "hidden":
        if head != "inline":
            raise UsageError("--head external names the output head of a hidden-state file: add --store hidden")
        return
    if fmt != CONTAINER:
        raise UsageError("--store hidden: only kldtool's container holds hidden states; use --format kldtool")
    if keep:
        raise UsageError(f"--store hidden stores whole hidden states; drop --keep top-{keep}")
    if not tolerance > 0:
        raise UsageError(f"--replay-tolerance {tolerance:g}: must be above 0")


class HiddenStore:
    """The base phase's side of a hidden-state file (the flags were checked by check_store)."""

    def __init__(self, engine, tolerance: float = DEFAULT_TOLERANCE, head: str = "inline"):
        self.head = with_hidden_states(engine).output_head()
        self.source = None
        if head == "external":  # the file names the model; compare reads the head from it and checks its hash
            self.source = head_source(engine)
        if self.head.dtype == "float64":  # a float64 reference run, stored at float32: its replay error shows the cost
            b = self.head.bias
            self.head = replace(self.head, weight=self.head.weight.float(), bias=None if b is None else b.float())
        if self.head.state_dtype not in DTYPES:
            raise UsageError(
                f"--store hidden: the output head's dtype {self.head.dtype} cannot be stored ({', '.join(DTYPES)})"
            )
        self.dtype = torch_dtype(self.head.state_dtype)
        self.tolerance = tolerance
        self.probe = ReplayProbe(self.head, PROBE_CHUNKS)
        self.metadata = {"store": "hidden", "hidden": {"dim": self.head.shape[1], "dtype": self.head.state_dtype}}

    def blocks(self, engine, windows):
        """(window number, stored hidden rows, float32 NLL of each target) block by block, the
        first chunks' blocks checked against their logits on the way."""

        def probe_rows(w) -> int:  # rows of ``w`` whose logits an engine that keeps them in its workers returns
            return PROBE_ROWS if self.probe.takes(w.index) else 0

        for i, off, hidden, logits, nll in engine.hidden_blocks(windows, probe_rows):
            w = windows[i]
            stored = hidden.to(self.dtype)
            if logits is not None:  # the probe keeps only its windows' blocks
                self.probe.offer(w.index, stored[: len(logits)], logits)
            if nll is None:
                nll = target_nll(logits, w.targets[off : off + len(logits)])
            yield i, raw_array(stored), nll
        self.check()

    def check(self) -> None:
        r = self.probe.result()
        if r["tokens"] and r["kld_mean"] > self.tolerance:
            raise ReplayMismatch(
                f"base: the stored hidden states replay the engine's logits with a mean KLD of "
                f"{r['kld_mean']:.3g} nats (max {r['kld_max']:.3g}, |Δlogit| up to "
                f"{r['max_abs_dlogit']:.3g}) over {r['tokens']} tokens, above --replay-tolerance "
                f"{self.tolerance:g}: no file written"
            )

    def finish(self, writer) -> dict:
        writer.set_head(self.head, self.source)
        return {"replay": self.probe.result() | {"tolerance": self.tolerance}}
