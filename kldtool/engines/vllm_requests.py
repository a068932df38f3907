"""What the offline vLLM engine and the served one share: each window becomes one vLLM
request whose spec tells the worker hook (vllm_worker.py) what to do with its logits, and
the three modes read their results the same way whichever channel brought them."""

from __future__ import annotations

import os
import uuid
from abc import abstractmethod

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.base import Engine
from kldtool.errors import EngineError
from kldtool.protocols import Window
from kldtool.reduce import TokenRecords


def window_keys(windows: list[Window]) -> list[str]:
    """Request keys unique to this call, so results of different calls never mix."""
    run = uuid.uuid4().hex[:12]
    return [f"{run}-{w.index}" for w in windows]


def window_spec(key: str, w: Window, logits_block: int, mode: dict) -> dict:
    """What the worker hook needs to score window ``w`` (vllm_worker.WorkerState.on_step)."""
    return {"key": key, "first": w.first, "n_scored": w.n_scored, "chunk": w.index, "after": int(w.targets[-1]),
            "logits_block": logits_block, **mode}


class HookedEngine(Engine):
    """An engine whose windows are scored inside vLLM's workers: subclasses send the
    requests and bring back each window's arrays (``_run``)."""

    reduces_here = False
    tokenizer = None
    logits_block: int

    @abstractmethod
    def _run(self, windows: list[Window], mode_for) -> list[dict]:
        """Per window, the arrays its request's hook produced; ``mode_for(w)`` is the mode part of its spec."""

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def windows_per_call(self, n_ctx: int) -> int:
        return self._windows_per_call

    def logits(self, windows: list[Window]) -> list:
        raise EngineError(f"the {self.name} engine keeps logits on its device; it scores and encodes there")

    def score(self, windows: list[Window], base) -> list[TokenRecords]:
        path = os.path.abspath(base.path)
        results = self._run(windows, lambda w: {"mode": "compare", "base": path})
        return [TokenRecords.from_columns(r) for r in results]

    def encode(self, windows: list[Window], coding):
        from dataclasses import asdict

        from kldtool.logitsfile.header import rows_width

        # The workers return each window's rows whole (one array per request).
        width = rows_width(self.n_vocab, coding.keep)
        results = self._run(windows, lambda w: {"mode": "encode", "row_width": width, "coding": asdict(coding)})
        for i, r in enumerate(results):
            yield i, r["rows"], r["nll"]

    hidden_dtype: str  # the model's dtype, which its hidden states come in
    _head = None

    def output_head(self):
        if self._head is None:
            self._head = self._output_head()
        return self._head

    def _output_head(self):
        """The output head as this engine's vLLM applies it (an OutputHead)."""
        raise EngineError(self._no_hidden())

    def hidden_blocks(self, windows: list[Window], probe_rows=None):
        import torch

        from kldtool.logitsfile.hidden import DTYPES, from_raw

        dim, dtype = self.output_head().shape[1], self.hidden_dtype
        rows = probe_rows or (lambda w: 0)
        results = self._run(windows, lambda w: {"mode": "hidden", "dim": dim, "hidden_item": DTYPES[dtype][0],
                                                "n_vocab": self.n_vocab, "probe_rows": min(rows(w), w.n_scored)})
        for i, r in enumerate(results):
            hidden = from_raw(r["hidden"].tobytes(), dtype, r["hidden"].shape)
            yield i, 0, hidden, (torch.from_numpy(r["logits"].copy()) if "logits" in r else None), r["nll"]

    def nll(self, windows: list[Window]) -> list[np.ndarray]:
        return [r["nll"] for r in self._run(windows, lambda w: {"mode": "nll"})]
