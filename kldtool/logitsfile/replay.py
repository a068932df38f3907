"""Hidden-state files read as row files: the stored form whose frames are final hidden states
(the container's transform 3), replayed through the file's output head into the very uint16 rows
a row file would hold, on the host or on the engine's device; and the base phase's replay probe,
which measures how exactly the replay reproduces the engine's own logits.
"""

from __future__ import annotations

import hashlib
import math
import threading

import numpy as np

from kldtool.codec import Coding
from kldtool.errors import CorruptData, HeadMismatch, MetadataError
from kldtool.logitsfile.header import BaseHeader
from kldtool.logitsfile.hidden import DTYPES, OutputHead, expected_head_length, from_raw, ggml_head, is_head_dtype
from kldtool.logitsfile.transforms import HIDDEN_CODE, Transform
from kldtool.compiled.core_share import spread

MAX_DIM = 1 << 16


class HiddenStates(Transform):
    """Frames of ``dim`` values of ``dtype`` a row; the head is stored once after the last frame
    (or only named, with its hash: ``--head external``)."""

    code = HIDDEN_CODE
    error = CorruptData
    replayed = True

    def __init__(self, header: BaseHeader, dim: int, dtype: str):
        super().__init__(header)
        self.dim, self.dtype = dim, dtype
        self.itemsize = DTYPES[dtype][1]
        self.head: OutputHead | None = None  # writing: the head finish stores
        self.head_source: str | None = None  # writing: only named (--head external); reading: --head-from
        self.meta: dict = {}  # reading: the metadata's "head"

    @property
    def width(self) -> int:
        return self.dim

    def size_range(self, n_rows: int) -> tuple[int, int]:
        n = n_rows * self.dim * self.itemsize
        return n, n

    def frame_bytes(self, rows: np.ndarray) -> bytes:  # already the stored dtype's bytes (hidden.raw_array)
        return np.ascontiguousarray(rows).tobytes()

    def metadata(self) -> dict:
        return {"hidden": {"dim": self.dim, "dtype": self.dtype}}

    def head_section(self, offset: int) -> tuple[dict, bytes]:
        """Writing: the head's metadata, and the bytes to store at ``offset`` (none when external)."""
        if self.head is None:
            raise ValueError("a hidden-state container needs its output head before it is finished")
        section = self.head.section()
        if self.head_source:  # --head external: the model is named, the head hashed, nothing stored
            return self.head.describe(section) | {"external": self.head_source}, b""
        return self.head.describe(section) | {"offset": offset}, section

    # --- reading -----------------------------------------------------------------------

    @classmethod
    def opened(cls, header: BaseHeader, metadata: dict, read_at, fail, frames_end: int, index_offset: int):
        """As Transform.opened; the metadata's two entries (hidden, head) are checked before
        anything is sized from them."""
        hid, head = metadata.get("hidden"), metadata.get("head")
        try:
            dim, dtype = int(hid["dim"]), hid["dtype"]
            if dtype not in DTYPES or not 0 < dim <= MAX_DIM:
                raise ValueError(f"dim {dim}, dtype {dtype!r}")
            v, d = (int(x) for x in head["shape"])
            if not is_head_dtype(head["dtype"]) or d != dim or v < header.n_vocab:
                raise ValueError(
                    f"head of shape {head['shape']} and dtype {head['dtype']!r} for hidden states of "
                    f"{dim} and a vocabulary of {header.n_vocab}"
                )
            external = head.get("external")
            offset, length = (frames_end if external else int(head["offset"])), int(head["length"])
            if length != expected_head_length(head):
                raise ValueError(f"head section of {length} bytes, its shape needs {expected_head_length(head)}")
            if external is not None and not isinstance(external, str):
                raise ValueError(f"external head source {external!r}")
            str(head["sha256"])
        except (KeyError, TypeError, ValueError) as e:
            fail(f"hidden-state container with unusable 'hidden'/'head' metadata: {e}", MetadataError)
        if offset < frames_end or offset + (0 if external else length) != index_offset:
            fail(
                f"head section at offset {offset}, {length} bytes, does not lie between the last frame "
                f"({frames_end}) and the index ({index_offset})",
                CorruptData,
            )
        form = cls(header, dim, dtype)
        form.meta, form.read_at, form.fail = head, read_at, fail
        form.coding = Coding(metadata.get("codec", "grid"), header.clamp)
        form.replayer = Replayer(form._read_head)
        return form

    def use_head(self, source: str | None) -> bool:
        """``compare --head-from``: an external head, read (from ``source`` if given, else the
        model the file names) and checked now, not at the first replay; False for a stored head."""
        if not self.meta.get("external"):
            return False
        self.head_source = source
        self.replayer.head()
        return True

    def _read_head(self) -> OutputHead:
        head = self.meta
        if head.get("external"):
            from kldtool.logitsfile.head_source import load_head

            source = self.head_source or head["external"]
            loaded = load_head(source, head)
            got = loaded.describe(loaded.section())
            if (got["sha256"], got["dtype"], got["shape"]) != (head["sha256"], head["dtype"], head["shape"]):
                self.fail(
                    f"the output head of {source} ({got['dtype']} {got['shape']}, sha256 {got['sha256'][:16]}...) "
                    f"is not the one this file was written with ({head['dtype']} {head['shape']}, sha256 "
                    f"{head['sha256'][:16]}...)",
                    HeadMismatch,
                )
            return loaded
        data = self.read_at(head["offset"], head["length"])
        if len(data) != head["length"] or hashlib.sha256(data).hexdigest() != head["sha256"]:
            self.fail(
                f"output head at offset {head['offset']} does not match its sha256 in the metadata "
                f"(damaged or truncated)",
                CorruptData,
            )
        return OutputHead.from_section(data, head)

    def warm(self) -> None:
        self.replayer.warm()

    def _replayed(self, hidden):
        """Rows of the base logits replayed from hidden states: uint16 numpy rows from a numpy
        array (a GGUF head on the host, without torch), else int16 rows on ``hidden``'s device."""
        from kldtool.codec.encode import encode_device

        logits = self.replayer.logits(hidden)[:, : self.header.n_vocab]  # a padded head's extra rows
        if isinstance(logits, np.ndarray):
            from kldtool.codec.rows_compiled import encode_compiled as encode
        else:
            encode = encode_device
        return encode(logits, self.coding.codec, self.coding.clamp)[0]

    def rows(self, data, n_rows: int) -> np.ndarray:
        if ggml_head.is_ggml(self.meta["dtype"]):
            return self._replayed(np.frombuffer(data, dtype="<f4").reshape(n_rows, self.dim))
        from kldtool.codec import rows_to_numpy

        return rows_to_numpy(self._replayed(from_raw(data, self.dtype, (n_rows, self.dim))))

    def rows_torch(self, buf, n_rows: int):
        return self._replayed(from_raw(buf, self.dtype, (n_rows, self.dim)))


class Replayer:
    """The head on each device it is asked for, loaded once (prefetch threads share it)."""

    def __init__(self, load_head):
        self._load = load_head
        self._lock = threading.Lock()
        self._head: OutputHead | None = None
        self._on: dict = {}

    def head(self) -> OutputHead:
        with self._lock:
            if self._head is None:
                head = self._load()
                head.matrix()  # a GGUF head's dequantization, once
                self._head = head
            return self._head

    def warm(self) -> None:
        """Load the head (a GGUF head: dequantized, and the compiled encoder its host replay uses)
        on a thread while the engine computes its first batch; the first replay waits for it,
        and meets any error it had. The encoder's loop is the one the calling thread will run
        (all cores, or one on a lane's thread)."""
        threading.Thread(target=self._warm, args=(spread(),), name="kldtool-head-warm-up", daemon=True).start()

    def _warm(self, all_cores: bool) -> None:
        try:
            if self.head().ggml:  # the host replays a GGUF head through the compiled encoder
                from kldtool.codec.rows_compiled import warm

                warm(all_cores)
        except Exception:  # the first replay loads it again and reports what failed
            pass

    def logits(self, hidden):
        """float32 logits of ``hidden``: a numpy array (a GGUF head's replay on the host) or a
        torch tensor on its device, the head's weight moved there once."""
        head = self.head()
        if isinstance(hidden, np.ndarray):
            return head.apply(hidden, head.matrix(), head.bias)
        import torch

        key = str(hidden.device)
        with self._lock:
            if key not in self._on:
                self._on[key] = tuple(
                    None if t is None else torch.as_tensor(t).to(hidden.device) for t in (head.matrix(), head.bias)
                )
            w, b = self._on[key]
        return head.apply(hidden, w, b)


class ReplayProbe:
    """The base phase's check of its own file: the engine's logits against those replayed from
    the hidden states it stores, as KLD(engine || replay) in float64 and the largest |Δlogit|,
    over the blocks of the first ``chunks`` windows it is offered."""

    def __init__(self, head: OutputHead, chunks: int):
        self.head = head
        self.limit = chunks
        self.windows: set[int] = set()
        self.sum = 0.0
        self.count = 0
        self.kld_max = 0.0
        self.dlogit_max = 0.0

    def takes(self, window: int) -> bool:
        """Whether blocks of ``window`` are checked (the first ``chunks`` windows asked about)."""
        if window not in self.windows:
            if len(self.windows) == self.limit:
                return False
            self.windows.add(window)
        return True

    def offer(self, window: int, stored_hidden, logits) -> None:
        if not self.takes(window):
            return
        import torch

        h = self.head
        stored = stored_hidden.cpu()
        replay = torch.as_tensor(h.apply(stored.numpy() if h.ggml else stored, h.matrix(), h.bias))
        ref = torch.as_tensor(logits).detach().cpu().to(torch.float64)
        lp, lq = torch.log_softmax(ref, dim=1), torch.log_softmax(replay.to(torch.float64), dim=1)
        kld = (lp.exp() * (lp - lq)).sum(dim=1)
        self.sum += float(kld.sum())
        self.count += len(kld)
        self.kld_max = max(self.kld_max, float(kld.max()))
        self.dlogit_max = max(self.dlogit_max, float((ref - replay.to(torch.float64)).abs().max()))

    def result(self) -> dict:
        mean = self.sum / self.count if self.count else math.nan
        return {
            "chunks": len(self.windows),
            "tokens": self.count,
            "kld_mean": mean,
            "kld_max": self.kld_max,
            "max_abs_dlogit": self.dlogit_max,
        }
