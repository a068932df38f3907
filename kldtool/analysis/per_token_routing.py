"""The per-token file's MoE routing columns (``compare --per-token`` where routing is compared):
``routing_first``, the first routed layer whose experts differ from the base's (-1 where none
does), and ``routing_flips``, a bit per routed layer (numpy's packbits, first layer in the top
bit), with the layers' numbers in the attribute ``routing_layers``. Appended beside the main
records to their own ``.NAME.routing.partial``, cut back with them on ``--resume``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from kldtool.errors import OutputError, StateError


class RoutingColumns:
    def __init__(self, tmp: Path, layers: tuple[int, ...], resume_tokens: int = 0):
        self.layers = layers
        self.record = np.dtype([("first", "<i2"), ("flips", "u1", ((len(layers) + 7) // 8,))])
        self.tmp = tmp.with_name(tmp.name + ".routing")
        try:
            self.fh = self._reopen(resume_tokens) if resume_tokens else open(self.tmp, "wb")
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot write the per-token routing ({e.strerror})") from None

    def _reopen(self, n_tokens: int):
        have = self.tmp.stat().st_size // self.record.itemsize if self.tmp.exists() else 0
        if have < n_tokens:
            raise StateError(
                f"{self.tmp}: holds the routing of {have} tokens, the checkpoint {n_tokens}; rerun without --resume"
            )
        fh = open(self.tmp, "r+b")
        fh.truncate(n_tokens * self.record.itemsize)
        fh.seek(0, os.SEEK_END)
        return fh

    def add(self, first: np.ndarray, changed: np.ndarray) -> None:
        """``first``: per token the index of its first departing layer (len(layers): none);
        ``changed``: tokens x layers booleans."""
        rec = np.empty(len(first), self.record)
        numbers = np.array([*self.layers, -1], np.int16)
        rec["first"] = numbers[first]
        rec["flips"] = np.packbits(changed, axis=1)
        try:
            self.fh.write(rec.tobytes())
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot write the per-token routing ({e.strerror})") from None

    def flush(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def finish(self, h5) -> None:
        """Add the columns to the open HDF5 file ``h5``; the partial goes once that file is in place."""
        self.fh.close()
        rec = np.fromfile(self.tmp, self.record)
        for name, col in (("routing_first", rec["first"]), ("routing_flips", rec["flips"])):
            h5.create_dataset(name, data=np.ascontiguousarray(col), compression="gzip", compression_opts=4)
        h5.attrs["routing_layers"] = json.dumps(list(self.layers))

    def close(self, keep: bool) -> None:
        self.fh.close()
        if not keep:
            self.tmp.unlink(missing_ok=True)


def read_routing_columns(h5) -> dict[str, np.ndarray]:
    """The routing columns of an open per-token file, or none: ``routing_first`` (layer numbers,
    -1) and ``routing_flipped`` (how many layers flipped, per token)."""
    if "routing_first" not in h5:
        return {}
    flips = h5["routing_flips"][:]
    n_layers = len(json.loads(h5.attrs["routing_layers"]))
    flipped = np.unpackbits(flips, axis=1, count=n_layers).sum(axis=1) if len(flips) else np.zeros(0, int)
    return {"routing_first": h5["routing_first"][:], "routing_flipped": flipped}
