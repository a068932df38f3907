"""What leaves a worker's hook: arrays packed for vLLM's RPC (the offline engine), and a served
request's result published into its exchange directory (renamed into place only once whole)."""

from __future__ import annotations

import io

import numpy as np

from kldtool.engines.vllm import wire
from kldtool.engines.vllm.seam import log


def pack(arrays: dict[str, np.ndarray]) -> dict:
    # vLLM's RPC turns bare ndarrays in untyped results into lists: send (dtype, shape, bytes).
    return {k: (a.dtype.str, list(a.shape), a.tobytes()) for k, a in arrays.items()}


def unpack(packed: dict) -> dict[str, np.ndarray]:
    return {k: np.frombuffer(b, dtype=np.dtype(dt)).reshape(shape) for k, (dt, shape, b) in packed.items()}


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def publish(directory: str, key: str, kind: str, payload: bytes) -> None:
    """Renamed into place only once whole: the client may look at any moment. Failing to write
    must not stop vLLM's step: the client then finds no result; the server's log says why."""
    from kldtool.logitsfile.atomic import AtomicFile

    try:
        f = AtomicFile(wire.exchange_path(directory, key, kind))
        try:
            f.write(payload)
            f.commit()
        finally:
            f.abort()
    except Exception as e:
        log.error(
            "kldtool: cannot write %s's result to %s: %s", key, directory, wire.one_line(f"{type(e).__name__}: {e}")
        )
