"""The one small interface every engine implements. Engines decide nothing about scoring:
they evaluate the windows they are given and hand back the scored rows' logits."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Iterable

import numpy as np

from kldtool.codec import encode_base_rows
from kldtool.protocols import Window
from kldtool.reduce import TokenRecords, reduce_rows


class Engine(ABC):
    name: str = "?"
    n_vocab: int
    bos_id: int | None  # set when the model wants a BOS first (llama.cpp's add_bos)
    device: str = "cpu"
    n_ctx_train: int | None = None  # the longest context the model was trained for, if known

    @abstractmethod
    def tokenize(self, text: bytes) -> np.ndarray:
        """Whole-text tokenization with special tokens added as the model asks (no EOS)."""

    @abstractmethod
    def token_strings(self) -> Iterable[bytes]:
        """The vocabulary's token texts in id order (for the identity hash)."""

    @abstractmethod
    def windows_per_call(self, n_ctx: int) -> int:
        """How many windows :meth:`logits` should get at once."""

    @abstractmethod
    def logits(self, windows: list[Window]) -> list:
        """Per window, a float32 (or the model's own float dtype) torch tensor (n_scored,
        n_vocab) on ``self.device``: the logits at offsets first .. first+n_scored-1. The
        tensors may be views of the engine's own buffers (no copy of a batch's logits): they
        are valid until the next call."""

    def score(self, windows: list[Window], base) -> list[TokenRecords]:
        """Compare mode: per window, its per-token records against the base rows.

        ``base`` gives ``rows_torch(chunk_index, device)`` (int16 rows, prefetched, asked for
        in order) and ``path``; an engine whose workers read the base file themselves uses
        the latter."""
        return [reduce_rows(lg, base.rows_torch(w.index, lg.device), w.targets)
                for w, lg in zip(windows, self.logits(windows))]

    def encode(self, windows: list[Window], codec: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Base mode: per window, (uint16 base rows made with ``codec``, float32 NLL of each target)."""
        return [encode_base_rows(lg, w.targets, codec) for w, lg in zip(windows, self.logits(windows))]

    @abstractmethod
    def describe(self) -> dict:
        """Engine, model, dtype and versions, for the metadata of outputs."""

    def close(self) -> None:
        pass

    def tokenizer_identity(self) -> str:
        """sha256 over the token texts, NUL-separated: equal vocabularies hash equal across engines."""
        cached = getattr(self, "_identity", None)
        if cached is None:
            h = hashlib.sha256()
            for t in self.token_strings():
                h.update(t)
                h.update(b"\0")
            cached = self._identity = "sha256:" + h.hexdigest()
        return cached
