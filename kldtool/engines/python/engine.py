"""Custom models: ``--engine python --model package.module:factory`` (or ``file.py:factory``).

The factory is called with no arguments and returns an object with

- ``tokenizer``: has ``encode(text: str) -> list[int]``; its ``get_vocab()`` (str -> id) or
  ``convert_ids_to_tokens`` names the tokens for the identity hash (ids as text otherwise);
- ``logits(ids)`` (or the object itself is callable): int64 tensor (batch, seq) -> float
  tensor (batch, seq, vocab) of next-token logits, on any device;
- optionally ``step(ids, state) -> (logits, state)``: the same logits for a block of a
  window, given the state the previous block returned (None before the first). A window
  longer than ``-b`` tokens then runs block by block with its state carried, so a
  recurrent model scores a 16k-token document in memory that does not grow with it;
- optionally ``hidden(ids)`` and ``head`` for ``base --store hidden``: the final hidden states
  (batch, seq, d) that the output head turns into those logits, and the head itself (an
  ``nn.Linear``, or any object with ``weight`` (vocab x d) and an optional ``bias``), with
  optional ``logit_multiplier`` and ``logit_softcap`` on the factory's object for what the
  model does to the head's output (``cap * tanh(multiplier * logits / cap)``). The logits still
  come from ``logits(ids)``, and the replay probe checks the head against them;
- optionally ``bos_id`` (put first in every tokenized text, and replaced at chunk starts as
  llama.cpp does), ``prefix_id`` (the token before each document under ``--protocol
  rolling``; default ``bos_id``), ``n_ctx_train`` and ``name``;
- optionally ``max_parallel`` (with ``step``): the longest window ``logits(ids)`` takes; longer
  ones go through ``step`` (xlstm's parallel forward refuses inputs past its context);
- optionally ``pad_id``: ``ppl`` does not score targets equal to it (the evaluation
  convention of music models whose songs carry padding).

This is how a model transformers does not know (a recurrent xLSTM, a music model) is scored.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import numpy as np

from kldtool.engines.contract import Facts, carried_blocks, whole_windows
from kldtool.errors import EngineError, UsageError
from kldtool.text.protocols import Window


def load_factory(spec: str):
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UsageError(f"--model {spec!r}: the python engine takes package.module:factory or file.py:factory")
    try:
        if target.endswith(".py"):
            if not os.path.isfile(target):
                raise EngineError(f"{target}: no such file")
            mod_spec = importlib.util.spec_from_file_location(f"kldtool_user_{abs(hash(target))}", target)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # as `python -m` would: modules beside the user
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except ImportError as e:
        raise EngineError(f"--model {spec}: cannot import {target} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EngineError(f"--model {spec}: {target} has no callable {attr!r}")
    return factory


class PythonEngine:
    name = "python"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "PythonEngine":
        if opts.model is None:
            raise UsageError("--engine python needs --model package.module:factory")
        if opts.dtype is not None or opts.device not in (None, "cpu"):
            raise UsageError("--dtype/--device: a python engine's factory decides its own")
        return cls(opts.model, threads=opts.threads, batch_tokens=opts.batch_tokens)

    def __init__(self, spec: str, threads: int | None = None, batch_tokens: int = 2048, obj=None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.spec, self.batch_tokens = spec, batch_tokens
        obj = load_factory(spec)() if obj is None else obj
        self.tokenizer = getattr(obj, "tokenizer", None)
        if not callable(getattr(self.tokenizer, "encode", None)):
            raise EngineError(f"--model {spec}: the factory's object has no tokenizer with encode(text)")
        self.fn = getattr(obj, "logits", None) or (obj if callable(obj) else None)
        if self.fn is None:
            raise EngineError(f"--model {spec}: the factory's object has no logits(ids) and is not callable")
        self.obj = obj
        self.step = getattr(obj, "step", None)
        if self.step is not None and not callable(self.step):
            raise EngineError(f"--model {spec}: the factory's object has a step that is not callable")
        self.bos_id = getattr(obj, "bos_id", None)
        self.prefix_id = getattr(obj, "prefix_id", self.bos_id)
        self.n_ctx_train = getattr(obj, "n_ctx_train", None)
        self.max_parallel = getattr(obj, "max_parallel", None)
        self.pad_id = getattr(obj, "pad_id", None)
        if self.max_parallel is not None and self.step is None:
            raise EngineError(f"--model {spec}: the factory's object has max_parallel but no step for longer windows")
        self.model_name = getattr(obj, "name", spec)
        probe = self._forward(torch.zeros((1, 1), dtype=torch.int64))
        self.n_vocab = int(probe.shape[-1])
        self.device = str(probe.device)
        self.facts = self._facts()

    def _facts(self) -> Facts:
        import torch

        return Facts(
            name=self.name,
            n_vocab=self.n_vocab,
            bos_id=self.bos_id,
            prefix_id=self.prefix_id,
            n_ctx_train=self.n_ctx_train,
            pad_id=self.pad_id,
            model=self.spec,
            dtype="python",
            device=self.device,
            versions={"torch": torch.__version__},
            details={"name": self.model_name},
            recorded=("engine", "model", "dtype", "device", "versions"),
        )

    def _forward(self, ids):
        import torch

        with torch.inference_mode():
            return self._checked(self.fn(ids), ids, "logits")

    def _checked(self, out, ids, what: str):
        import torch

        if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(ids.shape):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise EngineError(
                f"--model {self.spec}: {what}(ids of shape {tuple(ids.shape)}) returned {got}, "
                f"expected (batch, seq, vocab)"
            )
        return out

    def tokenize(self, text: bytes) -> np.ndarray:
        ids = list(self.tokenizer.encode(text.decode("utf-8")))
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return np.asarray(ids, dtype=np.int32)

    def token_strings(self):
        tok = self.tokenizer
        if callable(getattr(tok, "get_vocab", None)):
            names = {i: s for s, i in tok.get_vocab().items()}
        elif callable(getattr(tok, "convert_ids_to_tokens", None)):
            names = dict(enumerate(tok.convert_ids_to_tokens(list(range(self.n_vocab)))))
        else:
            names = {}
        for i in range(self.n_vocab):
            yield str(names.get(i, i)).encode("utf-8")

    def windows_per_call(self, n_ctx: int) -> int:
        return max(1, self.batch_tokens // n_ctx)

    def logits(self, windows: list[Window]) -> list:
        import torch

        ids = torch.from_numpy(np.stack([w.tokens for w in windows]).astype(np.int64))
        out = self._forward(ids)
        first, n_scored = windows[0].first, windows[0].n_scored
        return [out[i, first : first + n_scored] for i in range(len(windows))]

    def logit_blocks(self, windows: list[Window]):
        # One shape per group: whole windows in one call when they fit, else each through step.
        whole = min(self.batch_tokens, self.max_parallel or self.batch_tokens)
        if self.step is None or len(windows[0].tokens) <= whole:
            yield from whole_windows(self.logits(windows))
            return
        import torch

        for i, w in enumerate(windows):
            ids = torch.from_numpy(w.tokens.astype(np.int64))[None]
            state = None
            with torch.inference_mode():
                for a, b, lo in carried_blocks(w, self.batch_tokens):
                    got = self.step(ids[:, a:b], state)
                    if not isinstance(got, tuple) or len(got) != 2:
                        raise EngineError(
                            f"--model {self.spec}: step(ids, state) returned {type(got).__name__}, "
                            "expected (logits, state)"
                        )
                    lg, state = self._checked(got[0], ids[:, a:b], "step")[0], got[1]
                    if lo < b:
                        yield i, lo - w.first, lg[lo - a :]

    def hidden_blocks(self, windows: list[Window], probe_rows=None):
        import torch

        hidden = getattr(self.obj, "hidden", None)
        if not callable(hidden):
            raise UsageError(self._no_hidden())
        ids = torch.from_numpy(np.stack([w.tokens for w in windows]).astype(np.int64))
        with torch.inference_mode():
            h, out = hidden(ids), self._forward(ids)
        if not isinstance(h, torch.Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != tuple(ids.shape):
            got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise EngineError(
                f"--model {self.spec}: hidden(ids of shape {tuple(ids.shape)}) returned {got}, expected (batch, seq, d)"
            )
        first, n_scored = windows[0].first, windows[0].n_scored
        for i in range(len(windows)):
            yield i, 0, h[i, first : first + n_scored], out[i, first : first + n_scored], None

    def output_head(self):
        from kldtool.logitsfile.hidden import OutputHead

        head = getattr(self.obj, "head", None)
        weight = getattr(head, "weight", None)
        if not callable(getattr(self.obj, "hidden", None)) or weight is None:
            raise UsageError(self._no_hidden())
        bias = getattr(head, "bias", None)
        return OutputHead(
            weight=weight.detach().cpu(),
            bias=None if bias is None else bias.detach().cpu(),
            multiplier=getattr(self.obj, "logit_multiplier", None),
            softcap=getattr(self.obj, "logit_softcap", None),
        )

    def _no_hidden(self) -> str:
        return (
            f"--store hidden: the factory's object of --model {self.spec} has no hidden(ids) and head "
            f"(see --engine python in docs/protocols.md); use --store logprobs"
        )

    def close(self) -> None:
        pass  # the factory's object is freed with the engine
