"""Runs inside vLLM's worker processes (``LLM(worker_extension_cls=...)``).

For each opted-in request it turns the logits of the scored positions into kldtool's
per-token records (compare), uint16 base rows (base) or target NLL (ppl) right where the logits are, reading
the request's base rows straight from the base file. Only those small arrays leave the
worker, when the driver asks for them with ``collective_rpc("kldtool_pop")``.
"""

from __future__ import annotations

import numpy as np

from kldtool.engines import vllm_seam

LOGITS_BUDGET = 256 << 20  # bytes of logits the hook holds at once, by default


def logits_block_rows(n_vocab: int, itemsize: int, budget: int = LOGITS_BUDGET) -> int:
    """Rows per logits block: each row is the all-gathered logits in the model's dtype plus
    their float32 copy for the reducer (at least 16 rows)."""
    return max(16, budget // (n_vocab * (itemsize + 4)))


def pack(arrays: dict[str, np.ndarray]) -> dict:
    # vLLM's RPC turns bare ndarrays in untyped results into lists: send (dtype, shape, bytes).
    return {k: (a.dtype.str, list(a.shape), a.tobytes()) for k, a in arrays.items()}


def unpack(packed: dict) -> dict[str, np.ndarray]:
    return {k: np.frombuffer(b, dtype=np.dtype(dt)).reshape(shape) for k, (dt, shape, b) in packed.items()}


class _RequestResult:
    def __init__(self, spec: dict):
        n = spec["n_scored"]
        self.filled = np.zeros(n, dtype=np.int32)
        if spec["mode"] == "compare":
            from kldtool.reduce import FIELDS

            self.arrays = {f: np.zeros(n, dt) for f, dt in FIELDS.items()}
        elif spec["mode"] == "nll":
            self.arrays = {"nll": np.zeros(n, np.float32)}
        else:
            self.arrays = {"rows": np.zeros((n, spec["row_width"]), np.uint16), "nll": np.zeros(n, np.float32)}


class WorkerState:
    """Per-worker bookkeeping: open base files and the results of unfinished requests."""

    def __init__(self):
        self.results: dict[str, _RequestResult] = {}
        self.feeds: dict[str, object] = {}
        self.rank = vllm_seam.tp_rank()

    def _feed(self, path: str, device):
        # A request prefilled in several steps asks for the next rows of its chunk: the feed
        # keeps the frames last asked for, and reads the next ones while the model runs.
        if path not in self.feeds:
            from kldtool.logitsfile import open_base_file
            from kldtool.logitsfile.prefetch import ChunkFeed

            self.feeds[path] = ChunkFeed(open_base_file(path), device)
        return self.feeds[path]

    def on_step(self, spec: dict, prompt, start: int, n_computed: int, logits_fn) -> None:
        first, n_scored = spec["first"], spec["n_scored"]
        lo, hi = max(start, first), min(start + n_computed, first + n_scored)
        # The step's scored rows in blocks (spec "logits_block"), so the logits held at once
        # stay under the engine's budget however many tokens vLLM schedules in one step.
        block = spec.get("logits_block") or max(hi - lo, 1)
        for a in range(lo, hi, block):
            b = min(a + block, hi)
            logits = logits_fn(a, b)  # every tensor-parallel rank must make this call, the same way
            if self.rank == 0 and logits is not None:
                self._consume(spec, prompt, a, b, logits)

    def _consume(self, spec: dict, prompt, lo: int, hi: int, logits) -> None:
        import torch

        first = spec["first"]
        logits = logits.to(torch.float32)
        ids = list(prompt[lo + 1:hi + 1])
        if len(ids) < hi - lo:  # the prompt's last position is scored (rolling): its target follows it
            ids.append(spec["after"])
        targets = torch.as_tensor(ids, dtype=torch.int64, device=logits.device)
        res = self.results.setdefault(spec["key"], _RequestResult(spec))
        j0, j1 = lo - first, hi - first
        if spec["mode"] == "compare":
            from kldtool.reduce import FIELDS, reduce_base

            feed = self._feed(spec["base"], logits.device)
            rows = feed.rows(spec["chunk"], j0, j1)
            rec = reduce_base(logits, rows, targets, feed.reader.header)
            for f in FIELDS:
                res.arrays[f][j0:j1] = getattr(rec, f)
        elif spec["mode"] == "nll":
            from kldtool.codec import target_nll

            res.arrays["nll"][j0:j1] = target_nll(logits, targets)
        else:
            from kldtool.codec import Coding, encode_base_rows

            res.arrays["rows"][j0:j1], res.arrays["nll"][j0:j1] = encode_base_rows(logits, targets,
                                                                                   Coding(**spec["coding"]))
        res.filled[j0:j1] += 1

    def pop(self, keys: list[str]) -> dict:
        if self.rank != 0:
            return {}
        out = {}
        for k in keys:
            res = self.results.pop(k, None)
            if res is None:
                out[k] = {"error": "no positions were scored (prefix cache hit, or the hook never ran)"}
                continue
            if not (res.filled == 1).all():
                bad = int(np.nonzero(res.filled != 1)[0][0])
                out[k] = {"error": f"scored position {bad} seen {int(res.filled[bad])} times, expected once"}
                continue
            out[k] = pack(res.arrays)
        return out


class KldtoolWorker:
    """Mixed into vLLM's worker class; its methods are called through collective_rpc."""

    def kldtool_install(self) -> str:
        if getattr(self, "_kldtool", None) is None:
            self._kldtool = WorkerState()
        kind = vllm_seam.install(self.model_runner, self._kldtool.on_step)
        return f"rank{self._kldtool.rank}:{type(self.model_runner).__name__}:{kind}"

    def kldtool_pop(self, keys: list[str]) -> dict:
        return self._kldtool.pop(keys)
