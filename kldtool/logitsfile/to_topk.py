"""A full-row base file made compact (``convert --keep top-K``, ``pack``): each stored row becomes
the top-K record the base run would have written, read from the codes it stored
(codec/topk_records.topk_of_rows), in kldtool's container. The tokens, window table and
metadata are the source's; a hidden-state file converts the rows it replays."""

from __future__ import annotations

import dataclasses

import numpy as np

from kldtool.codec.rows import rows_to_numpy, rows_to_torch
from kldtool.codec.topk_records import rest_np, topk_of_rows
from kldtool.errors import UsageError
from kldtool.logitsfile.header import CONTAINER
from kldtool.text.protocols import stored_windows

# Rows decoded at once: bounds the float64 temporaries to ~ this many bytes.
BLOCK_BYTES = 64 << 20


def write_topk(reader, dst: str, keep: int, metadata: dict, frame_rows: int | None = None) -> None:
    """Write ``reader``'s rows as top-``keep`` records to the new container ``dst`` (through the
    writer's partial file: nothing at ``dst`` until it is whole)."""
    from kldtool.logitsfile import create_writer

    header = reader.header
    if header.keep:
        raise UsageError(f"{reader.path}: already holds top-{header.keep} records; --keep needs full rows")
    if keep > header.n_vocab:
        raise UsageError(f"--keep top-{keep}: the vocabulary has only {header.n_vocab} entries")
    out = dataclasses.replace(header, keep=keep)
    windows = stored_windows(reader.tokens, header, None)  # targets only: the BOS never is one
    step = max(1, BLOCK_BYTES // (8 * header.n_vocab))
    writer = create_writer(dst, CONTAINER, out, reader.tokens, metadata, frame_rows=frame_rows)
    try:
        for chunk, w in enumerate(windows):
            rows, targets = reader.read_chunk(chunk), np.asarray(w.targets)
            for a in range(0, len(rows), step):
                block = rows_to_torch(rows[a : a + step])
                writer.write_rows(rows_to_numpy(topk_of_rows(block, targets[a : a + step], keep, header.n_vocab)))
            writer.end_chunk()
        writer.finish()
    except BaseException:
        writer.abort()
        raise


def outside_mass(reader) -> dict:
    """The probability mass the top-K records of ``reader`` leave out, over every scored row:
    mean and 99th percentile (what bounds how far the lower bound can sit below the KLD)."""
    values = np.concatenate([rest_np(reader.read_chunk(c)) for c in range(reader.header.n_chunk)]).astype(np.float64)
    return {"mean": float(values.mean()), "p99": float(np.percentile(values, 99))}
