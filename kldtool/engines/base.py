"""The one small interface every engine implements. Engines decide nothing about scoring:
they evaluate the windows they are given and hand back the scored rows' logits."""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from typing import Iterable, Iterator

import numpy as np

from kldtool.codec import Coding, target_nll
from kldtool.codec.encode import encode_base_slices
from kldtool.errors import UsageError
from kldtool.text.protocols import Window
from kldtool.reduce import TokenRecords, reduce_base, settled


class Engine(ABC):
    name: str = "?"
    n_vocab: int
    bos_id: int | None  # set when the model wants a BOS first (llama.cpp's add_bos)
    prefix_id: int | None = None  # what lm-eval puts before a document (rolling): BOS, else EOS
    device: str = "cpu"
    n_ctx_train: int | None = None  # the longest context the model was trained for, if known
    pad_id: int | None = None  # ppl does not score targets equal to it (python engines may set one)
    reduces_here: bool = True  # False where the engine's own workers reduce (vLLM)
    takes_contexts = False  # --contexts: contexts side by side (llama.cpp)
    takes_vllm_args = False  # vLLM's own flags
    takes_attention_flags = False  # llama.cpp's --kv-cache-dtype (beside no other vLLM flag) and --flash-attn
    source: dict | None = None  # where the model came from (model_ref.ModelRef.record), set by make_engine

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "Engine":
        """The engine ``opts`` (engines.EngineOptions) describe, for windows of ``n_ctx`` tokens,
        after this engine's own checks of the flags."""
        raise NotImplementedError

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
        n_vocab) on ``self.device``, or for an engine computing on the host a float32 numpy
        array: the logits at offsets first .. first+n_scored-1. They may be views of the
        engine's own buffers (no copy of a batch's logits): valid until the next call."""

    def schedule(self, batches: list[list[Window]]):
        """How this engine runs ``batches`` (schedule.py): by default one call each, in order."""
        from kldtool.engines.schedule import Schedule

        return Schedule(self, batches)

    def logit_blocks(self, windows: list[Window]) -> Iterator[tuple[int, int, object]]:
        """(window number in ``windows``, first scored row, logits of the following rows), in
        order. An engine that can carry its state across a window (a KV cache) yields a long
        window in blocks, so no tensor of window x vocab ever exists; by default, whole windows."""
        for i, lg in enumerate(self.logits(windows)):
            yield i, 0, lg

    def _per_block(self, windows: list[Window], fn) -> list[list]:
        """fn(window, first row, logits) of every block, by window. A pending result (work
        queued on a device) is taken once the next block's is queued: the device works on that
        block while the host waits for and files this one."""
        parts: list[list] = [[] for _ in windows]
        held = None
        for i, off, lg in self.logit_blocks(windows):
            got = fn(windows[i], off, lg)
            if held is not None:
                parts[held[0]].append(settled(held[1]))
            held = (i, got)
        if held is not None:
            parts[held[0]].append(settled(held[1]))
        return parts

    def rows_source(self, reader, chunks: list[int]):
        """What :meth:`score` reads base rows from for ``chunks`` (asked for in that order):
        by default their frames, read ahead on threads; closed after the last of them."""
        from kldtool.logitsfile.prefetch import PrefetchedChunks

        return PrefetchedChunks(reader, chunks, device=self.device)

    def score(self, windows: list[Window], source) -> list[TokenRecords]:
        """Compare mode: per window, its per-token records against the base rows.

        ``source`` is what :meth:`rows_source` made: it gives ``rows_torch(chunk_index, device,
        start, stop)`` (int16 rows, prefetched frame by frame, asked for in order;
        ``parts_numpy(chunk_index, start, stop)`` beside numpy logits), or for an engine whose
        workers read the base file themselves, its ``path``."""

        def reduce(w: Window, off: int, lg):
            n = len(lg)  # the base rows of this block only: a long window never lies whole in memory
            if not isinstance(lg, np.ndarray):
                rows = source.rows_torch(w.index, lg.device, off, off + n)
                return reduce_base(lg, rows, w.targets[off : off + n], source.header, defer=True)
            parts, a = [], 0  # on the host, frame by frame: the rows are never copied
            for rows in source.parts_numpy(w.index, off, off + n):
                b = a + len(rows)
                parts.append(reduce_base(lg[a:b], rows, w.targets[off + a : off + b], source.header))
                a = b
            return TokenRecords.concat(parts)

        return [TokenRecords.concat(p) for p in self._per_block(windows, reduce)]

    def encode(self, windows: list[Window], coding: Coding) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Base mode: (window number in ``windows``, uint16 base rows, or top-K records, made
        as ``coding`` says, float32 NLL of each of their targets), block by block in order, so
        the base file is written as the rows come and no window's rows are ever held whole."""
        for i, off, lg in self.logit_blocks(windows):
            for rows, nll in encode_base_slices(lg, windows[i].targets[off : off + len(lg)], coding):
                yield i, rows, nll

    def hidden_blocks(
        self, windows: list[Window], probe_rows=None
    ) -> Iterator[tuple[int, int, object, object, object]]:
        """Base mode with ``--store hidden``: (window number, first scored row, the final hidden
        states of the following rows in the model's dtype, their logits, None), block by block.
        An engine whose logits stay in its workers gives their target NLL instead of None, and
        logits only for the first ``probe_rows(window)`` rows of a window (the replay probe's),
        or None."""
        raise UsageError(self._no_hidden())

    def output_head(self):
        """The output head as this engine applies it (logitsfile/hidden.py's OutputHead)."""
        raise UsageError(self._no_hidden())

    def head_source(self) -> str:
        """Where ``compare`` finds this engine's output head again (``base --head external``):
        the model's absolute path."""
        path = self.describe().get("model")
        if not path or not os.path.exists(path):
            raise UsageError(
                f"--head external: the {self.name} engine's model is not a file or directory "
                f"({path!r}) that compare could read the head from; store it in the file (--head inline)"
            )
        return os.path.abspath(path)

    def _no_hidden(self) -> str:
        return (
            f"--store hidden: the {self.name} engine does not give its final hidden states and output head "
            f"(the transformers, llamacpp, vllm and python engines do); use --store logprobs"
        )

    def nll(self, windows: list[Window]) -> list[np.ndarray]:
        """Score mode: per window, the float32 NLL of each target (full-vocabulary normalisation)."""
        parts = self._per_block(windows, lambda w, off, lg: target_nll(lg, w.targets[off : off + len(lg)]))
        return [_join(p) for p in parts]

    def routing_shape(self):
        """A mixture of experts' routers (routing/rows.py's RouterShape) where this engine can
        read the experts they choose, else None."""
        return None

    def record_routing(self):
        """Start recording each scored row's routing; the recorder's ``pop(window index)``
        gives a window's rows (routing/rows.py's Routed) once its blocks are through."""
        raise UsageError(
            f"--routing: the {self.name} engine does not record MoE routing (transformers and llamacpp do; "
            f"docs/metrics.md, 'MoE routing')"
        )

    @abstractmethod
    def describe(self) -> dict:
        """Engine, model, dtype and versions, for the metadata of outputs."""

    def close(self) -> None:
        pass

    def tokenizer_identity(self) -> str:
        """sha256 over the token texts, NUL-separated: equal vocabularies hash equal across engines."""
        cached = getattr(self, "_identity", None)
        if cached is None:
            texts = list(self.token_strings())  # one update: the same digest as one per text
            digest = hashlib.sha256(b"\0".join(texts) + b"\0" if texts else b"").hexdigest()
            cached = self._identity = "sha256:" + digest
        return cached


def carried_blocks(w: Window, size: int) -> Iterator[tuple[int, int, int]]:
    """(a, b, lo) per block of a window run ``size`` tokens at a time through state the engine
    carries (a KV cache, a recurrent state): tokens a..b-1 go in, and positions lo..b-1 are
    scored (none when lo == b, a block before the first scored position)."""
    end = w.first + w.n_scored
    for a in range(0, end, size):
        b = min(a + size, end)
        yield a, b, max(a, w.first)


def _join(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
