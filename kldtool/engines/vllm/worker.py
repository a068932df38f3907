"""The hook inside vLLM's workers (installed by the offline engine through ``collective_rpc``, or
in a server's workers by plugin.py).

For each request that carries a kldtool spec it turns the logits of the scored positions into
kldtool's per-token records (compare), uint16 base rows (encode), target NLL (nll) or hidden
states (hidden) right where the logits are, reading the request's base rows straight from the
base file. Only those small arrays leave the worker: offline when the driver asks for them
(``kldtool_pop``); for a served request, written to its exchange directory the moment its last
position is scored, which is before vLLM answers it.

A served request is hostile until checked (wire.parse, then the operator's policy), and no
failure of one request may reach vLLM's step: a refused or failed request gets a one-line
error, written where the operator allows, else logged, and vLLM answers it as a completion.
Whether a request is taken on depends only on its spec, its prompt and the server's settings,
which every tensor-parallel rank sees alike, so all ranks ask for the same logits; file checks
and allocations happen on the one rank that keeps results and can only fail that request.
Each phase of a request (admission, each block, completion) has its own guard. Files are only
touched through the descriptors admission opened: the base file's (base_feeds.py) and the
exchange directory's (confined.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from kldtool.engines.vllm import request_memory, seam, wire
from kldtool.engines.vllm.base_feeds import BaseFeeds
from kldtool.engines.vllm.confined import ExchangeDir
from kldtool.engines.vllm.delivery import head_shard, npz, pack, publish
from kldtool.engines.vllm.policy import Policy, Refused

log = seam.log


def _reason(e: BaseException) -> str:
    text = str(e) if isinstance(e, (wire.SpecError, Refused)) else f"{type(e).__name__}: {e}"
    return wire.one_line(text)


@dataclass(kw_only=True)
class _Request:
    """What the hook holds for one of vLLM's requests until it leaves the runner."""

    key: str | None = None  # a valid key (the result's file name stem)
    where: ExchangeDir | None = None  # served: the exchange directory admission opened, until delivery
    feed: tuple | None = None  # compare: the identity of its base file's feed in WorkerState.feeds
    spec: wire.Spec | None = None  # None: refused, no logits are asked for it
    arrays: dict | None = None
    filled: np.ndarray | None = None
    error: str | None = None
    done: bool = False

    def release(self) -> None:
        """Close its exchange directory: a request delivers once (or is dropped)."""
        if self.where is not None:
            self.where.close()
            self.where = None


def _arrays(spec: wire.Spec, n_vocab: int) -> dict[str, np.ndarray]:
    n = spec.n_scored
    if spec.mode == "compare":
        from kldtool.reduce import FIELDS

        return {f: np.zeros(n, dt) for f, dt in FIELDS.items()}
    out = {"nll": np.zeros(n, np.float32)}
    if spec.mode == "encode":
        out["rows"] = np.zeros((n, spec.row_width), np.uint16)
    elif spec.mode == "hidden":  # the head's input, as raw bytes of the model's dtype
        out["hidden"] = np.zeros((n, spec.dim), np.dtype(spec.hidden_item))
        if spec.probe_rows:  # the replay probe's rows: the engine's own logits
            out["logits"] = np.zeros((spec.probe_rows, n_vocab), np.float32)
    return out


class WorkerState:
    """One worker's hook: the requests it has seen and the base files it has open."""

    def __init__(self, facts: dict, policy: Policy, rank: int, first_stage: bool = True, last_stage: bool = True):
        self.model = wire.ModelFacts(facts["n_vocab"], facts["hidden_size"], facts["dtype"])
        self.policy = policy
        self.rank, self.first_stage, self.last_stage = rank, first_stage, last_stage
        # One worker keeps results: tensor-parallel rank 0 of the pipeline's last stage, the one
        # that computes logits. Every other rank of that stage still makes the same logits calls.
        self.keeps = rank == 0 and last_stage
        # With no other rank waiting on its logits calls, the keeper skips those of a failed request.
        self.alone = facts.get("tensor_parallel_size", 1) == 1
        self.device = facts.get("device", "cpu")  # where base rows must be for the reducer
        from kldtool.reduce import FIELDS

        # What a probe request is told; the statistics, so that a client whose records have other
        # columns is refused before it reads a result.
        self.info = {"rank": rank, "wire": wire.VERSION, "statistics": list(FIELDS), **facts}
        self.requests: dict[str, _Request] = {}  # by vLLM's request id
        self.finished: dict[str, dict] = {}  # offline: results by key until the driver takes them
        self.feeds = BaseFeeds(policy, self.device)

    # --- a step --------------------------------------------------------------------------

    def step(self, req_id: str, raw_spec, prompt, start: int, n_computed: int, logits_fn, hidden_fn) -> None:
        req = self.requests.get(req_id)
        if req is None:
            req = self.requests[req_id] = self._admitted(raw_spec, len(prompt))
        spec = req.spec
        if spec is None or req.done:
            return
        end = spec.first + spec.n_scored
        lo, hi = max(start, spec.first), min(start + n_computed, end)
        if req.error is None or not self.alone:  # a failed request's calls only keep other ranks in step
            self._blocks(req, prompt, lo, hi, logits_fn, hidden_fn)
        if lo < hi == end:
            # This step reached the window's last scored position (an error earlier in it is
            # kept until now, so nothing of it lingers in the exchange directory afterwards).
            req.done = True
            if self.keeps:
                try:
                    self._complete(req)
                except Exception as e:  # its result could not be written: logged, the step goes on
                    log.warning("kldtool: request %s: %s", req.key or "(no valid key)", _reason(e))

    def _blocks(self, req: _Request, prompt, lo: int, hi: int, logits_fn, hidden_fn) -> None:
        """The step's scored rows lo..hi-1 in blocks, so the logits held at once stay under the
        budget however many tokens vLLM schedules in one step."""
        for a in range(lo, hi, req.spec.logits_block):
            b = min(a + req.spec.logits_block, hi)
            logits = logits_fn(a, b)  # every tensor-parallel rank must make this call, the same way
            if self.keeps and logits is not None and req.error is None:
                try:
                    self._consume(req, prompt, a, b, logits, hidden_fn)
                except Exception as e:  # this request's error, never vLLM's
                    req.error = _reason(e)

    def sweep(self, alive) -> None:
        """Forget requests vLLM no longer holds: finished, or aborted before their last position."""
        for req_id in [r for r in self.requests if not alive(r)]:
            req = self.requests.pop(req_id)
            req.release()
            if not req.done and req.spec is not None and self.keeps:
                log.warning("kldtool: request %s ended before its last scored position; its result is dropped", req.key)

    # --- admission: everything a request says is checked before anything is allocated -----

    def _admitted(self, raw_spec, prompt_len: int) -> _Request:
        """_admit's request, or a refused one where admission itself failed. What decides
        whether logits are asked for is the same on every rank, so a failure there is too."""
        req = _Request()
        try:
            return self._admit(req, raw_spec, prompt_len)
        except Exception as e:
            self._log_refusal(None, _reason(e))
            req.release()
            return _Request(done=True)

    def _admit(self, req: _Request, raw_spec, prompt_len: int) -> _Request:
        try:
            spec = wire.decode(raw_spec)
        except wire.SpecError as e:
            self._log_refusal(None, _reason(e))
            req.done = True
            return req
        env = wire.envelope(spec)
        req.key = env.key
        if self.policy.served and not self.policy.token_ok(env.token):
            # Not the operator's client: it is told nothing and may write nothing.
            self._log_refusal(env.key, "the request's token is missing or wrong")
            req.done = True
            return req
        if self.keeps and self.policy.served and env.key and env.out:
            try:
                req.where = self.policy.exchange_dir(env.out)
            except Exception as e:  # on this rank alone: it may not change what is asked of the others
                self._log_refusal(env.key, _reason(e))
        try:
            if self.policy.problem:
                raise wire.SpecError(self.policy.problem)
            parsed = wire.parse(spec, prompt_len, self.model, self.policy.served)
            if self.policy.served:  # decided from the spec and settings alone: alike on every rank
                request_memory.check(parsed, self.model, self.policy.max_request_bytes)
            req.spec = parsed
        except wire.SpecError as e:
            if self.keeps:
                self._deliver(req, {"error": _reason(e)})
            req.done = True
            return req
        if req.spec.mode == "probe":
            if self.keeps:
                self._deliver(req, {"info": self.info})
            req.done = True
        elif self.keeps:
            try:
                if self.policy.served and req.where is None:
                    raise Refused("its result could not be written (see the log above)")
                if req.spec.mode == "compare":
                    reading = {r.feed for r in self.requests.values() if r.feed is not None and not r.done}
                    req.feed = self.feeds.admit(req.spec.base, reading)
                    self._check_base(req.spec, self.feeds.get(req.feed, req.spec.base))
                req.arrays = _arrays(req.spec, self.model.n_vocab)
                req.filled = np.zeros(req.spec.n_scored, np.int32)
            except Exception as e:  # MemoryError included: the request fails, the server does not
                req.error = _reason(e)
        return req

    def _log_refusal(self, key: str | None, reason: str) -> None:
        if self.keeps:
            log.warning("kldtool: request %s refused: %s", key or "(no valid key)", reason)

    def _check_base(self, spec: wire.Spec, feed) -> None:
        h = feed.reader.header
        if h.n_vocab != self.model.n_vocab:
            raise Refused(f"{spec.base}: a vocabulary of {h.n_vocab}, the served model's is {self.model.n_vocab}")
        if spec.chunk >= h.n_chunk:
            raise Refused(f"{spec.base}: chunk {spec.chunk} of a file of {h.n_chunk}")
        if h.rows_of(spec.chunk) != spec.n_scored:
            raise Refused(
                f"{spec.base}: chunk {spec.chunk} scores {h.rows_of(spec.chunk)} positions, the request {spec.n_scored}"
            )

    # --- results -----------------------------------------------------------------------

    def _consume(self, req: _Request, prompt, lo: int, hi: int, logits, hidden_fn) -> None:
        import torch

        spec = req.spec
        logits = logits.to(torch.float32)
        ids = list(prompt[lo + 1 : hi + 1])
        if len(ids) < hi - lo:  # the prompt's last position is scored (rolling): its target follows it
            ids.append(spec.after)
        targets = torch.as_tensor(ids, dtype=torch.int64, device=logits.device)
        j0, j1 = lo - spec.first, hi - spec.first
        arrays = req.arrays
        if spec.mode == "compare":
            from kldtool.reduce import FIELDS, reduce_base

            feed = self.feeds.get(req.feed, spec.base)
            rec = reduce_base(logits, feed.rows(spec.chunk, j0, j1), targets, feed.reader.header)
            for f in FIELDS:
                arrays[f][j0:j1] = getattr(rec, f)
        elif spec.mode == "encode":
            from kldtool.codec import Coding, encode_base_rows

            arrays["rows"][j0:j1], arrays["nll"][j0:j1] = encode_base_rows(logits, targets, Coding(**spec.coding))
        else:
            from kldtool.codec import target_nll

            arrays["nll"][j0:j1] = target_nll(logits, targets)
            if spec.mode == "hidden":
                from kldtool.logitsfile.hidden import raw_array

                arrays["hidden"][j0:j1] = raw_array(hidden_fn(lo, hi))
                k = min(j1, spec.probe_rows)
                if j0 < k:
                    arrays["logits"][j0:k] = logits[: k - j0].cpu().numpy()
        req.filled[j0:j1] += 1

    def _complete(self, req: _Request) -> None:
        if req.error is None and not (req.filled == 1).all():
            bad = int(np.nonzero(req.filled != 1)[0][0])
            req.error = f"scored position {bad} seen {int(req.filled[bad])} times, expected once"
        self._deliver(req, {"error": req.error} if req.error is not None else {"arrays": req.arrays})
        req.arrays = req.filled = None

    def _deliver(self, req: _Request, result: dict) -> None:
        """A request's result or error: offline kept for the driver, served written to its
        exchange directory where the operator allows it, else logged."""
        if "error" in result:
            log.warning("kldtool: request %s: %s", req.key or "(no valid key)", result["error"])
        if not self.policy.served:
            if req.key is not None:
                self.finished[req.key] = pack(result["arrays"]) if "arrays" in result else result
            return
        if req.where is None or req.key is None:
            return  # logged: at admission (where) or just above (error)
        try:
            if "arrays" in result:
                kind, payload = "npz", npz(result["arrays"])
            elif "info" in result:
                kind, payload = "json", json.dumps(result["info"]).encode()
            else:
                kind, payload = "err", result["error"].encode()
            publish(req.where, req.key, kind, payload)
        finally:
            req.release()

    def pop(self, keys: list[str]) -> dict:
        """Offline: the results of ``keys`` (and nothing older stays behind)."""
        if not self.keeps:
            return {}
        out = {
            k: self.finished.pop(k, {"error": "no positions were scored (prefix cache hit, or the hook never ran)"})
            for k in keys
        }
        self.finished.clear()
        return out


def install(worker, policy: Policy) -> str:
    """Hook a vLLM worker whose model is loaded (idempotent); returns what was hooked."""
    state = seam.attached(worker)
    if state is None:
        first, last = seam.pp_stage()
        state = WorkerState(seam.worker_facts(worker), policy, seam.tp_rank(), first, last)
        seam.attach(worker, state)
        if policy.problem and state.keeps:
            log.error("%s", policy.problem)
    runner, kind = seam.install_on_worker(worker, state, state.first_stage)
    state.info["hook"] = kind
    stage = "" if state.first_stage and state.last_stage else (":last-stage" if state.last_stage else ":early-stage")
    return f"rank{state.rank}:{runner}:{kind}{stage}"


class KldtoolWorker:
    """Mixed into vLLM's worker class by the offline engine (``worker_extension_cls``); its
    methods are called through ``collective_rpc``. It reads nothing of the worker itself."""

    def kldtool_install(self) -> str:
        return install(self, Policy.offline())

    def kldtool_allocator(self) -> str | None:
        """This worker's allocation policy (memory.py), set where ``KLDTOOL_MALLOC`` names one,
        and named. By default a worker keeps glibc's: under heap its page faults fell, but its
        peak rose by far more than a vLLM-CPU worker's KV cache, sized against host memory
        before, leaves room for (docs/benchmarks.md, the figures behind the code). Only
        kldtool's own workers are asked; a served model's belong to its operator."""
        from kldtool.runtime.memory import set_malloc_policy

        return set_malloc_policy(os.environ.get("KLDTOOL_MALLOC") or "glibc")

    def kldtool_pop(self, keys: list[str]) -> dict:
        return seam.attached(self).pop(keys)

    def kldtool_head(self) -> dict | None:
        return head_shard(self)


__all__ = ["KldtoolWorker", "WorkerState", "install"]
