"""A compare run's state: its accumulators, the chunks they cover and what they were computed
from. Written atomically every few chunks (the checkpoint ``--resume`` continues from) and at
the end (a shard that ``kldtool merge`` combines with others).

Stored as an ``.npz`` (no pickles): ``meta`` (UTF-8 JSON) plus the accumulator's arrays.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import numpy as np

from kldtool.errors import StateError
from kldtool.provenance.identity import model_identity
from kldtool.logitsfile.atomic import AtomicFile
from kldtool.text.window_order import Order, order_of
from kldtool.stats import KldAccumulator
from kldtool.stats.accumulator import SUMS, in_vector_order

KIND = "kldtool-compare-state"
# 5: the file names its chunk sums ("sums"), so a file is read by those names and refused by the
# ones it lacks; a new statistic changes the names, never this number.
VERSION = 5
_LLAMACPP = ("nll", "nll2", "base", "base2", "nll_base", "kld", "kld2", "dp", "dp2", "dp4")
_EXTRA = ("rkld", "rkld2", "jsd", "jsd2", "top5", "top5_2", "top10", "top10_2", "kld_tail")
_TV = ("tv", "tv2", "tv_hi", "p_out")
# The sums of the versions before files named them: 2 added the extra metrics', 3 total
# variation's and P_out's, 4 both models' top-1 probabilities (the confidence shift).
SUMS_OF_VERSION = {
    1: _LLAMACPP,
    2: _LLAMACPP + _EXTRA,
    3: _LLAMACPP + _EXTRA + _TV,
    4: _LLAMACPP + _EXTRA + _TV + ("ptop_q", "ptop_base", "dptop2"),
}


@dataclass
class RunState:
    meta: dict
    acc: KldAccumulator
    routing: np.ndarray | None = None  # routing/stats.py's rows, one per window scored with routing

    @property
    def chunk_range(self) -> tuple[int, int]:
        a, b = self.meta["chunk_range"]
        return int(a), int(b)

    @property
    def order(self) -> Order:
        return order_of(self.meta)

    def planned(self) -> list[int]:
        """Every window of the range, in the order the run visits them."""
        a, b = self.chunk_range
        return self.order.arrange(list(range(a, b)))

    @property
    def visited(self) -> int:
        return len(self.acc.chunks)

    @property
    def complete(self) -> bool:
        a, b = self.chunk_range
        return self.visited >= b - a

    def progress(self) -> str:
        """What the state holds, for messages: ``chunks 0:12`` or ``12 of the 40 windows of 0:40 (order random:3)``."""
        a, b = self.chunk_range
        if not self.order.random:
            return f"chunks {a}:{a + self.visited}"
        return f"{self.visited} of the {b - a} windows of {a}:{b} (order {self.order})"


def save_state(path: str, state: RunState) -> None:
    buf = io.BytesIO()
    meta = state.meta | {"kind": KIND, "version": VERSION, "sums": list(SUMS), "complete": state.complete}
    arrays = state.acc.arrays()
    if state.routing is not None:
        arrays = arrays | {"routing_windows": state.routing}
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8), **arrays)
    f = AtomicFile(path)
    f.write(buf.getbuffer())
    f.commit()


def load_state(path: str) -> RunState:
    def fail(msg: str):
        raise StateError(f"{path}: {msg}")

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        fail("no such file")
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        fail(f"not a kldtool state file ({type(e).__name__}: {e})")
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
    except (KeyError, UnicodeDecodeError, json.JSONDecodeError):
        fail("not a kldtool state file (no readable 'meta')")
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        fail("not a kldtool state file")
    names = meta.get("sums") if meta.get("version") == VERSION else SUMS_OF_VERSION.get(meta.get("version"))
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        fail(f"state version {meta.get('version')!r} is not one this kldtool reads (1 to {VERSION})")
    lacking = [n for n in SUMS if n not in names]
    if lacking:
        fail(
            f"written by an older kldtool: its chunk sums lack {', '.join(lacking)}; rerun that shard "
            f"or continue it with the kldtool that wrote it"
        )
    routing = arrays.pop("routing_windows", None)
    try:
        arrays["chunk_vectors"] = in_vector_order(arrays["chunk_vectors"], [*names, "n_same", "count"])
        acc = KldAccumulator.from_arrays(arrays)
        state = RunState(meta, acc, routing)
        if routing is not None and (routing.ndim != 2 or len(routing) > len(acc.chunks)):
            raise ValueError(f"routing rows of shape {routing.shape} for {len(acc.chunks)} windows")
        a, b = state.chunk_range
        planned = state.planned()
    except (KeyError, ValueError, TypeError) as e:
        fail(f"corrupt state ({e})")
    if acc.chunks != planned[: len(acc.chunks)] or len(acc.chunks) > b - a:
        fail(f"corrupt state: chunks {acc.chunks[:3]}... are not the first of {a}:{b} in order {state.order}")
    return state


def check_fits(state: RunState, path: str, base: dict, model: dict, chunk_range: tuple[int, int], order: Order) -> None:
    """Refuse to continue a checkpoint written for another base file, model, chunk range or order."""
    m = state.meta
    if m.get("base") != base:
        raise StateError(
            f"{path}: written for another base file (header/tokens differ); remove it or pass another --state"
        )
    if model_identity(m.get("model", {})) != model:
        raise StateError(
            f"{path}: written for model {m.get('model', {}).get('model')} "
            f"({m.get('model', {}).get('engine')}), this run uses {model['model']} ({model['engine']})"
        )
    if state.chunk_range != tuple(chunk_range):
        a, b = state.chunk_range
        raise StateError(f"{path}: covers chunks {a}:{b}, this run asks for {chunk_range[0]}:{chunk_range[1]}")
    if state.order != order:
        raise StateError(f"{path}: visits its windows in order {state.order}, this run asks for --order {order}")
