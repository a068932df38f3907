"""What the offline vLLM engine and the served one share: each window becomes one vLLM
request whose spec (wire.py) tells the hook in vLLM's workers (worker.py) what to do with its
logits, and the modes read their results the same way whichever channel brought them."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.vllm import wire
from kldtool.text.protocols import Window
from kldtool.reduce import TokenRecords


def window_specs(windows: list[Window], logits_block: int, mode_for) -> tuple[list[str], list[dict]]:
    """Keys unique to this call (results of different calls never mix) and each window's spec;
    ``mode_for(w)`` is the mode part of window ``w``'s."""
    run = wire.new_run()
    keys = [wire.window_key(run, w.index) for w in windows]
    return keys, [wire.window_spec(k, w, logits_block, mode_for(w)) for k, w in zip(keys, windows)]


class BasePath:
    """What a hooked engine's compare needs of the base file: its path (the workers read it)."""

    def __init__(self, reader):
        self.path = os.path.abspath(reader.path)
        self.header = reader.header

    def close(self) -> None:
        pass


def runner_of(hooks) -> str | None:
    """The model-runner generations (v1, v2) the hook went into, from its workers' answers
    (one per rank offline; a served model's probe reports one, as a string)."""
    runners = sorted({h.rsplit(":", 1)[-1] for h in ([hooks] if isinstance(hooks, str) else hooks or [])})
    return ",".join(runners) if runners else None


class HookedEngine(ABC):
    """A Scorer (engines/contract.py) whose windows are scored inside vLLM's workers:
    subclasses send the requests and bring back each window's arrays (``_run``)."""

    tokenizer = None
    logits_block: int

    @abstractmethod
    def _run(self, windows: list[Window], mode_for) -> list[dict]:
        """Per window, the arrays its request's hook produced (window_specs makes the requests)."""

    def rows_source(self, reader, chunks):
        return BasePath(reader)  # the workers read the rows: nothing is decoded here

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def windows_per_call(self, n_ctx: int) -> int:
        return self._windows_per_call

    def score(self, windows: list[Window], source) -> list[TokenRecords]:
        path = source.path  # the workers read the rows themselves
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

    @abstractmethod
    def _output_head(self):
        """The output head as this engine's vLLM applies it (an OutputHead)."""

    def hidden_blocks(self, windows: list[Window], probe_rows=None):
        import torch

        from kldtool.logitsfile.hidden import DTYPES, from_raw

        dim, dtype = self.output_head().shape[1], self.hidden_dtype
        rows = probe_rows or (lambda w: 0)
        results = self._run(
            windows,
            lambda w: {
                "mode": "hidden",
                "dim": dim,
                "hidden_item": DTYPES[dtype][0],
                "n_vocab": self.n_vocab,
                "probe_rows": min(rows(w), w.n_scored, wire.MAX_PROBE_ROWS),
            },
        )
        for i, r in enumerate(results):
            hidden = from_raw(r["hidden"].tobytes(), dtype, r["hidden"].shape)
            yield i, 0, hidden, (torch.from_numpy(r["logits"].copy()) if "logits" in r else None), r["nll"]

    def nll(self, windows: list[Window]) -> list[np.ndarray]:
        return [r["nll"] for r in self._run(windows, lambda w: {"mode": "nll"})]
