"""Runs inside vLLM's worker processes (``LLM(worker_extension_cls=...)``, or a server's
workers through the plugin in vllm_plugin.py).

For each opted-in request it turns the logits of the scored positions into kldtool's
per-token records (compare), uint16 base rows (base) or target NLL (ppl) right where the logits are, reading
the request's base rows straight from the base file. Only those small arrays leave the
worker: offline when the driver asks for them with ``collective_rpc("kldtool_pop")``; for a
served model, written to the request's exchange directory (spec ``out``) the moment its last
position is scored, which is before vLLM answers the request.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from kldtool.engines import vllm_seam

LOGITS_BUDGET = 256 << 20  # bytes of logits the hook holds at once, by default


def logits_block_rows(n_vocab: int, itemsize: int, budget: int = LOGITS_BUDGET) -> int:
    """Rows per logits block: each row is the all-gathered logits in the model's dtype plus
    their float32 copy for the reducer (at least 16 rows)."""
    return max(16, budget // (n_vocab * (itemsize + 4)))


def pack(arrays: dict[str, np.ndarray]) -> dict:
    # vLLM's RPC turns bare ndarrays in untyped results into lists: send (dtype, shape, bytes).
    return {k: (a.dtype.str, list(a.shape), a.tobytes()) for k, a in arrays.items()}


def unpack(packed: dict) -> dict[str, np.ndarray]:
    return {k: np.frombuffer(b, dtype=np.dtype(dt)).reshape(shape) for k, (dt, shape, b) in packed.items()}


def exchange_path(directory: str, key: str, kind: str) -> str:
    """Where a served request's result lands: ``KEY.npz`` (arrays), ``KEY.err`` (one line of
    text) or ``KEY.json`` (a probe's answer)."""
    return os.path.join(directory, f"{key}.{kind}")


def _publish(directory: str, key: str, kind: str, payload: bytes) -> None:
    from kldtool.logitsfile.atomic import AtomicFile

    # Renamed into place only once whole: the client may look at any moment.
    f = AtomicFile(exchange_path(directory, key, kind))
    try:
        f.write(payload)
        f.commit()
    finally:
        f.abort()


def _publish_or_log(spec: dict, kind: str, payload: bytes) -> None:
    """A served request's result into its exchange directory. Failing to write it must not stop
    vLLM's step: the client then finds no result and says so; the server's log says why."""
    try:
        _publish(spec["out"], spec["key"], kind, payload)
    except Exception as e:
        import logging

        logging.getLogger("kldtool").error("kldtool: cannot write %s's result to %s: %s", spec["key"], spec["out"], e)


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


class _RequestResult:
    def __init__(self, spec: dict):
        n = spec["n_scored"]
        self.filled = np.zeros(n, dtype=np.int32)
        self.error: str | None = None
        if spec["mode"] == "compare":
            from kldtool.reduce import FIELDS

            self.arrays = {f: np.zeros(n, dt) for f, dt in FIELDS.items()}
        elif spec["mode"] == "nll":
            self.arrays = {"nll": np.zeros(n, np.float32)}
        elif spec["mode"] == "hidden":  # the head's input, as raw bytes of the model's dtype
            self.arrays = {"hidden": np.zeros((n, spec["dim"]), np.dtype(spec["hidden_item"])),
                           "nll": np.zeros(n, np.float32)}
            if spec.get("probe_rows"):  # the replay probe's rows: the engine's own logits
                self.arrays["logits"] = np.zeros((spec["probe_rows"], spec["n_vocab"]), np.float32)
        else:
            self.arrays = {"rows": np.zeros((n, spec["row_width"]), np.uint16), "nll": np.zeros(n, np.float32)}


class WorkerState:
    """Per-worker bookkeeping: open base files and the results of unfinished requests."""

    def __init__(self, info: dict | None = None):
        self.results: dict[str, _RequestResult] = {}
        self.feeds: dict[str, object] = {}
        self.rank = vllm_seam.tp_rank()
        self.first_stage, self.last_stage = vllm_seam.pp_stage()
        # One worker keeps results: tensor-parallel rank 0 of the pipeline's last stage, the one
        # that computes logits. Every other rank of that stage still makes the same logits calls.
        self.keeps = self.rank == 0 and self.last_stage
        self.info = {"rank": self.rank, **(info or {})}  # what a probe request is told

    def _feed(self, path: str, device):
        # A request prefilled in several steps asks for the next rows of its chunk: the feed
        # keeps the frames last asked for, and reads the next ones while the model runs.
        if path not in self.feeds:
            from kldtool.logitsfile import open_base_file
            from kldtool.logitsfile.prefetch import ChunkFeed

            self.feeds[path] = ChunkFeed(open_base_file(path), device)
        return self.feeds[path]

    def on_step(self, spec: dict, prompt, start: int, n_computed: int, logits_fn, hidden_fn) -> None:
        if spec.get("mode") == "probe":
            if self.keeps and start == 0:
                _publish_or_log(spec, "json", json.dumps(self.info).encode())
            return
        first, n_scored = spec["first"], spec["n_scored"]
        lo, hi = max(start, first), min(start + n_computed, first + n_scored)
        # The step's scored rows in blocks (spec "logits_block"), so the logits held at once
        # stay under the engine's budget however many tokens vLLM schedules in one step.
        block = spec.get("logits_block") or max(hi - lo, 1)
        for a in range(lo, hi, block):
            b = min(a + block, hi)
            logits = logits_fn(a, b)  # every tensor-parallel rank must make this call, the same way
            if self.keeps and logits is not None:
                res = self.results.setdefault(spec["key"], _RequestResult(spec))
                if res.error is None:
                    try:
                        self._consume(spec, prompt, a, b, logits, res)
                        if spec["mode"] == "hidden":
                            self._keep_hidden(spec, a, b, hidden_fn(a, b), logits, res)
                    except Exception as e:  # a bad request must not take vLLM's engine down with it
                        res.error = f"{type(e).__name__}: {e}"
        if self.keeps and spec.get("out") and lo < hi == first + n_scored:
            # This step reached the window's last scored position: the request is complete
            # (an error earlier in it is kept until now, so nothing of it lingers afterwards).
            self._complete(spec)

    def _complete(self, spec: dict) -> None:
        res = self.results.pop(spec["key"])
        out = self._finish(res)
        if "error" in out:
            _publish_or_log(spec, "err", out["error"].encode())
        else:
            _publish_or_log(spec, "npz", _npz(res.arrays))

    def _consume(self, spec: dict, prompt, lo: int, hi: int, logits, res: _RequestResult) -> None:
        import torch

        first = spec["first"]
        logits = logits.to(torch.float32)
        ids = list(prompt[lo + 1:hi + 1])
        if len(ids) < hi - lo:  # the prompt's last position is scored (rolling): its target follows it
            ids.append(spec["after"])
        targets = torch.as_tensor(ids, dtype=torch.int64, device=logits.device)
        j0, j1 = lo - first, hi - first
        if spec["mode"] == "compare":
            from kldtool.reduce import FIELDS, reduce_base

            feed = self._feed(spec["base"], logits.device)
            rows = feed.rows(spec["chunk"], j0, j1)
            rec = reduce_base(logits, rows, targets, feed.reader.header)
            for f in FIELDS:
                res.arrays[f][j0:j1] = getattr(rec, f)
        elif spec["mode"] in ("nll", "hidden"):
            from kldtool.codec import target_nll

            res.arrays["nll"][j0:j1] = target_nll(logits, targets)
        else:
            from kldtool.codec import Coding, encode_base_rows

            res.arrays["rows"][j0:j1], res.arrays["nll"][j0:j1] = encode_base_rows(logits, targets,
                                                                                   Coding(**spec["coding"]))
        res.filled[j0:j1] += 1

    @staticmethod
    def _keep_hidden(spec: dict, lo: int, hi: int, hidden, logits, res: _RequestResult) -> None:
        from kldtool.logitsfile.hidden import raw_array

        j0, j1 = lo - spec["first"], hi - spec["first"]
        res.arrays["hidden"][j0:j1] = raw_array(hidden)
        k = min(j1, spec.get("probe_rows") or 0)
        if j0 < k:
            res.arrays["logits"][j0:k] = logits[:k - j0].float().cpu().numpy()

    def pop(self, keys: list[str]) -> dict:
        if not self.keeps:
            return {}
        out = {}
        for k in keys:
            res = self.results.pop(k, None)
            if res is None:
                out[k] = {"error": "no positions were scored (prefix cache hit, or the hook never ran)"}
            else:
                out[k] = self._finish(res)
        return out

    @staticmethod
    def _finish(res: _RequestResult) -> dict:
        if res.error is not None:
            return {"error": res.error}
        if not (res.filled == 1).all():
            bad = int(np.nonzero(res.filled != 1)[0][0])
            return {"error": f"scored position {bad} seen {int(res.filled[bad])} times, expected once"}
        return pack(res.arrays)


def head_shard(worker) -> dict | None:
    """This rank's rows of the output head (vllm_seam.head_rows), packed for the driver; None
    off the pipeline's last stage, which holds no head."""
    if not worker._kldtool.last_stage:
        return None
    from kldtool.logitsfile.hidden import raw_array

    try:
        part = vllm_seam.head_rows(worker.model_runner.model)
    except vllm_seam.HookUnavailable as e:
        return {"error": str(e)}
    tensors = {k: part.pop(k) for k in ("weight", "bias")}
    return part | {"dtype": str(tensors["weight"].dtype).removeprefix("torch."),
                   "arrays": pack({k: raw_array(t) for k, t in tensors.items() if t is not None})}


def install_on(worker) -> str:
    """Hook a vLLM worker whose model is loaded (idempotent); returns what was hooked."""
    if getattr(worker, "_kldtool", None) is None:
        import vllm

        config = worker.vllm_config
        worker._kldtool = WorkerState({
            "vllm": vllm.__version__, "n_vocab": int(config.model_config.get_vocab_size()),
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
            "prefix_caching": bool(config.cache_config.enable_prefix_caching)})
    state = worker._kldtool
    vllm_seam.ensure_pp_buffers(worker.model_runner, state.first_stage)
    kind = vllm_seam.install(worker.model_runner, state.on_step)
    state.info["hook"] = kind
    stage = "" if state.first_stage and state.last_stage else (":last-stage" if state.last_stage else ":early-stage")
    return f"rank{state.rank}:{type(worker.model_runner).__name__}:{kind}{stage}"


class KldtoolWorker:
    """Mixed into vLLM's worker class; its methods are called through collective_rpc."""

    def kldtool_install(self) -> str:
        return install_on(self)

    def kldtool_pop(self, keys: list[str]) -> dict:
        return self._kldtool.pop(keys)

    def kldtool_head(self) -> dict | None:
        return head_shard(self)
