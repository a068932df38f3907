"""What leaves a worker's hook: arrays packed for vLLM's RPC (the offline engine), and a served
request's result published into the exchange directory its admission opened (confined.py)."""

from __future__ import annotations

import io

import numpy as np

from kldtool.engines.vllm import seam, wire
from kldtool.engines.vllm.confined import ExchangeDir


def pack(arrays: dict[str, np.ndarray]) -> dict:
    # vLLM's RPC turns bare ndarrays in untyped results into lists: send (dtype, shape, bytes).
    return {k: (a.dtype.str, list(a.shape), a.tobytes()) for k, a in arrays.items()}


def unpack(packed: dict) -> dict[str, np.ndarray]:
    return {k: np.frombuffer(b, dtype=np.dtype(dt)).reshape(shape) for k, (dt, shape, b) in packed.items()}


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def publish(where: ExchangeDir, key: str, kind: str, payload: bytes) -> None:
    """Renamed into place only once whole, in the directory ``where`` holds open (the client
    may look at any moment). Failing to write must not stop vLLM's step: the client then finds
    no result; the server's log says why."""
    try:
        where.publish(wire.exchange_name(key, kind), payload)
    except Exception as e:
        seam.log.error(
            "kldtool: cannot write %s's result to %s: %s", key, where.shown, wire.one_line(f"{type(e).__name__}: {e}")
        )


def head_shard(worker) -> dict | None:
    """This rank's rows of the output head (seam.head_rows), packed for the driver; None off
    the pipeline's last stage, which holds no head."""
    if not seam.attached(worker).last_stage:
        return None
    from kldtool.logitsfile.hidden import raw_array

    try:
        part = seam.worker_head(worker)
    except seam.HookUnavailable as e:
        return {"error": str(e)}
    tensors = {k: part.pop(k) for k in ("weight", "bias")}
    return part | {
        "dtype": str(tensors["weight"].dtype).removeprefix("torch."),
        "arrays": pack({k: raw_array(t) for k, t in tensors.items() if t is not None}),
    }
