"""``compare --per-token FILE.h5``: every scored token's values in an HDF5 file, and reading
them back into an accumulator.

One row per scored token, in scoring order: ``chunk``, ``position`` (index of the predicted
token in the base file's token stream), ``target`` (its id), then the reducer's records, one
column per statistic of reduce/statistics.py (``nll`` as ``nll_q``); a column added after a file
was written reads from it as that statistic's ``older`` value (ids -1, values NaN)
(docs/metrics.md). The run's metadata is the JSON attribute ``run``; ``complete`` is set last.
MoE routing's columns, where the run compared it: per_token_routing.py.

While the run goes, the records are appended to ``.NAME.partial`` beside the target, synced to
disk whenever the compare state is checkpointed; ``--resume`` cuts them back to the
checkpoint's token count and appends from there. The HDF5 file appears only when the run ends.
"""

from __future__ import annotations

import json
import os
import numpy as np

from kldtool.analysis.per_token_routing import read_routing_columns
from kldtool.errors import OutputError, StateError, UsageError
from kldtool.logitsfile.atomic import output_target, partial_path
from kldtool.reduce import FIELDS as RECORD_FIELDS
from kldtool.reduce import TokenRecords
from kldtool.reduce.statistics import STATISTICS
from kldtool.stats import KldAccumulator

COLUMN_OF = {f: ("nll_q" if f == "nll" else f) for f in RECORD_FIELDS}
FIELDS = {
    "chunk": np.int32,
    "position": np.int64,
    "target": np.int32,
    **{COLUMN_OF[f]: dt for f, dt in RECORD_FIELDS.items()},
}
RECORD = np.dtype([(name, dtype) for name, dtype in FIELDS.items()])
KIND = "kldtool-per-token"
# Columns files of earlier versions lack, and what they read as: ids -1, values unknown (NaN).
LATER = {COLUMN_OF[s.name]: s.older for s in STATISTICS if s.older is not None}


class PerTokenWriter:
    """Appends fixed-size records to a flat ``.NAME.partial`` file (a crash loses at most the
    records after the last flush, and never corrupts the earlier ones); ``finish`` turns them
    into the HDF5 file."""

    def __init__(self, path: str, run: dict, resume_tokens: int = 0):
        self.path = output_target(path)
        self.tmp = partial_path(self.path)
        self.run = run
        self.resume_tokens, self.routing = resume_tokens, None
        try:
            if resume_tokens:
                self.fh = self._reopen(resume_tokens)
            else:
                self.fh = open(self.tmp, "wb")
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot write the per-token records ({e.strerror})") from None

    def _reopen(self, n_tokens: int):
        where = f"{self.tmp} (the per-token records of the interrupted run)"
        if not self.tmp.exists():
            raise StateError(f"{where}: missing; --per-token with --resume needs it. Rerun without --resume")
        have = self.tmp.stat().st_size // RECORD.itemsize
        if have < n_tokens:
            raise StateError(f"{where}: holds {have} tokens, the checkpoint {n_tokens}; rerun without --resume")
        fh = open(self.tmp, "r+b")
        fh.truncate(n_tokens * RECORD.itemsize)
        fh.seek(0, os.SEEK_END)
        return fh

    def add(self, chunk: int, positions: np.ndarray, targets: np.ndarray, r: TokenRecords) -> None:
        rec = np.empty(len(r), RECORD)
        cols = {
            "chunk": chunk,
            "position": positions,
            "target": targets,
            **{COLUMN_OF[f]: getattr(r, f) for f in RECORD_FIELDS},
        }
        for name in FIELDS:
            rec[name] = cols[name]
        try:
            self.fh.write(rec.tobytes())
        except OSError as e:
            raise OutputError(f"{self.tmp}: cannot write the per-token records ({e.strerror})") from None

    def with_routing(self, layers: tuple[int, ...]) -> None:
        from kldtool.analysis.per_token_routing import RoutingColumns

        self.routing = RoutingColumns(self.tmp, layers, self.resume_tokens)

    def flush(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        if self.routing:
            self.routing.flush()

    def finish(self, statistics: dict) -> None:
        import h5py

        self.fh.close()
        rec = np.fromfile(self.tmp, RECORD)
        h5_tmp = self.path.parent / f".{self.path.name}.partial-{os.getpid()}.h5"
        try:
            with h5py.File(h5_tmp, "w") as f:
                for name in FIELDS:
                    f.create_dataset(
                        name, data=np.ascontiguousarray(rec[name]), compression="gzip", compression_opts=4, shuffle=True
                    )
                if self.routing:
                    self.routing.finish(f)
                f.attrs["kind"] = KIND
                f.attrs["run"] = json.dumps(self.run)
                f.attrs["statistics"] = json.dumps(statistics)
                f.attrs["complete"] = True
            os.replace(h5_tmp, self.path)
        except OSError as e:
            h5_tmp.unlink(missing_ok=True)
            raise OutputError(f"{self.path}: could not write the per-token file ({e})") from None
        self.tmp.unlink()
        if self.routing:
            self.routing.close(keep=False)

    def close(self, keep: bool) -> None:
        """Stop without finishing: keep the records for --resume, or remove them."""
        self.fh.close()
        if not keep:
            self.tmp.unlink(missing_ok=True)
        if self.routing:
            self.routing.close(keep)


def read_per_token(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(run metadata, column arrays) of a finished per-token file."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise UsageError(f"{path}: not an HDF5 file ({e})") from None
    with f:
        if f.attrs.get("kind") != KIND:
            raise UsageError(f"{path}: not a kldtool per-token file (compare --per-token)")
        if not f.attrs.get("complete"):
            raise UsageError(f"{path}: incomplete per-token file (its compare run did not finish)")
        run = json.loads(f.attrs["run"])
        missing = [name for name in FIELDS if name not in f and name not in LATER]
        if missing:
            raise UsageError(f"{path}: written by an older kldtool (no column {missing[0]}); rerun compare --per-token")
        cols = {name: f[name][:] for name in FIELDS if name in f} | read_routing_columns(f)
    n = len(cols["chunk"])
    cols.update({name: np.full(n, fill, FIELDS[name]) for name, fill in LATER.items() if name not in cols})
    if len({len(c) for c in cols.values()}) != 1:
        raise UsageError(f"{path}: per-token columns of different lengths")
    return run, cols


def accumulate(parts: list[dict[str, np.ndarray]], where: str) -> KldAccumulator:
    """One accumulator over the tokens of several per-token files, chunk by chunk in chunk
    order: the same additions a single run over those chunks makes."""
    pieces = {}
    for cols in parts:
        chunks = cols["chunk"]
        bounds = np.flatnonzero(np.diff(chunks)) + 1
        for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(chunks)]):
            c = int(chunks[a])
            if c in pieces:
                raise UsageError(f"{where}: chunk {c + 1} appears in more than one per-token file")
            pieces[c] = TokenRecords.from_columns({f: cols[COLUMN_OF[f]][a:b] for f in RECORD_FIELDS})
    acc = KldAccumulator()
    for c in sorted(pieces):
        acc.add(pieces[c], c)
    return acc
