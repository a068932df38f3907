"""A model served by ``vllm serve`` (``--server URL``), scored by kldtool's hook in the
server's own workers (plugin.py: ``KLDTOOL_VLLM_HOOK=1`` and the operator's roots in the
server's environment, policy.py).

Each window is one OpenAI-style completion: the window's token ids as the prompt,
``max_tokens=1``, the hook's spec (wire.py) as a JSON string in ``vllm_xargs`` and a
``cache_salt`` of its own so vLLM's prefix cache can never hide a scored position. The
server's rank-0 worker reads the base rows from the base file's path and writes each request's
records to the exchange directory before vLLM answers it; both paths must therefore mean the
same files on the server's nodes as here (a shared filesystem on a cluster), inside the
directories the operator allows. The client needs neither vLLM nor the weights: the tokenizer
comes from the path the server reports (or ``-m``). Of kldtool's vLLM package it imports only
the wire format (and the engine base it shares with the offline engine).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import Facts
from kldtool.engines.vllm import wire
from kldtool.engines.vllm.hooked_engine import HookedEngine, runner_of, window_specs
from kldtool.engines.vllm.options import ServedOptions
from kldtool.engines.vllm.sampling import ServedSampler
from kldtool.engines.vllm.served_floor import ServedFloor, server_note
from kldtool.errors import EngineError, UsageError
from kldtool.logitsfile.hidden import DTYPES
from kldtool.reduce import FIELDS
from kldtool.runtime import http
from kldtool.text.protocols import Window

# A result written on another node may take a moment to show on a shared filesystem: how long
# the client waits for one before it calls the window unanswered (KLDTOOL_RESULT_GRACE_S sets it).
RESULT_GRACE_S = 10.0


def result_grace() -> float:
    try:
        return max(float(os.environ.get("KLDTOOL_RESULT_GRACE_S") or RESULT_GRACE_S), 0.1)
    except ValueError:
        return RESULT_GRACE_S


# Requests open at once: enough for the server to batch a call's windows, not a thread per window.
MAX_IN_FLIGHT = 128


class VllmServerEngine(ServedSampler, HookedEngine):
    name = "vllm-server"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "VllmServerEngine":
        specific = opts.specific or ServedOptions()
        if not specific.server:
            raise UsageError("--exchange-dir: only with --server URL")
        return cls(
            specific.server,
            tokenizer=opts.model,
            exchange_dir=specific.exchange_dir,
            n_ctx=n_ctx,
            windows_per_call=max(4, 65536 // (n_ctx or 2048)),
            logits_block=specific.logits_block,
        )

    def __init__(
        self,
        url: str,
        tokenizer: str | None = None,
        exchange_dir: str | None = None,
        n_ctx: int = 0,
        windows_per_call: int = 64,
        logits_block: int | None = None,
        timeout: float = 3600.0,
    ):
        self.url = http.checked_url(url, "--server").rstrip("/").removesuffix("/v1")
        self.timeout = timeout
        # Never redirected: a request's body carries the operator's token, which comes from the
        # environment (a flag would show in ps).
        self._http = http.Http(follow_redirects=False)
        self.token = os.environ.get(wire.TOKEN) or None
        self._windows_per_call = windows_per_call
        models = self._request("/v1/models").get("data") or []
        if not models:
            raise EngineError(f"{self.url}: the server lists no model")
        self.model_id = models[0]["id"]
        self.max_model_len = models[0].get("max_model_len")
        if n_ctx and self.max_model_len and n_ctx + 1 > self.max_model_len:
            raise UsageError(
                f"-c {n_ctx}: the served model's max_model_len is {self.max_model_len}; "
                f"a window needs -c + 1 (restart the server with --max-model-len {n_ctx + 1} or more)"
            )
        self._load_tokenizer(hf_tokenizer.served_tokenizer(tokenizer, models[0]))
        self._own_exchange = exchange_dir is None
        if exchange_dir is None:
            # A fresh directory of this run's inside the server's exchange root, when that is
            # visible here too (a server on this machine, or a shared filesystem).
            root = os.environ.get(wire.EXCHANGE_ROOT) or None
            try:
                exchange_dir = tempfile.mkdtemp(prefix="kldtool-exchange-", dir=root)
            except OSError as e:
                raise UsageError(
                    f"{wire.EXCHANGE_ROOT}={root}: cannot make this run's exchange directory there "
                    f"({e.strerror}); give --exchange-dir"
                ) from None
        self.exchange = os.path.abspath(exchange_dir)
        if not os.path.isdir(self.exchange):
            raise UsageError(f"--exchange-dir {exchange_dir}: no such directory")
        try:
            self.info = self._probe()
        except BaseException:
            self.close()  # a refused client leaves no directory of its own behind
            raise
        self.header_note = server_note(self.info)
        self.floor = ServedFloor()
        self.n_vocab = int(self.info["n_vocab"])
        self.hidden_dtype = self.info.get("dtype", "bfloat16")
        itemsize = DTYPES.get(self.hidden_dtype, ("", 2))[1]
        self.logits_block = logits_block or wire.logits_block_rows(self.n_vocab, itemsize)
        self.facts = self._facts()

    def _facts(self) -> Facts:
        info = self.info
        return Facts(
            name=self.name,
            n_vocab=self.n_vocab,
            bos_id=self.bos_id,
            prefix_id=self.prefix_id,
            n_ctx_train=self.n_ctx_train,
            model=self.model_id,
            dtype=info.get("dtype"),
            device="server",
            versions={"vllm": info.get("vllm")},
            tensor_parallel=int(info.get("tensor_parallel_size") or 1),
            runner=runner_of(info.get("hook")),
            details={
                "server": self.url,
                "tokenizer": self.tokenizer_path,
                "hooks": info.get("hook"),
                "parallel": {k: info.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size")},
                "batch_invariant": bool(info.get("batch_invariant")),
            },
            recorded=("engine", "model", "dtype", "device", "versions"),
        )

    def score(self, windows: list[Window], source) -> list:
        records = super().score(windows, source)
        self.floor.keep(windows, records)
        self._floor_source = source
        return records

    def served_floor(self, windows_total: int) -> dict | None:
        """The server's own repeatability (served_floor.py): the first windows scored, again."""
        return self.floor.measure(lambda ws: HookedEngine.score(self, ws, self._floor_source), windows_total)

    def _output_head(self):
        """The served model's head, read from its checkpoint here (the client cannot reach the
        workers' memory): the directory the tokenizer came from, in the server's dtype. The
        replay probe then checks it against the logits the server computed."""
        from kldtool.logitsfile.head_source import load_head

        return load_head(self.tokenizer_path, {"dtype": self.hidden_dtype})

    def _load_tokenizer(self, loaded: hf_tokenizer.ServedTokenizer) -> None:
        self.tokenizer, self.n_ctx_train, self.tokenizer_path = loaded.tokenizer, loaded.n_ctx_train, loaded.path
        self.bos_id, self.prefix_id = loaded.bos_id, loaded.prefix_id

    def _request(self, path: str, body: dict | None = None) -> dict:
        """One request under a total deadline of ``timeout`` seconds; its answer's JSON."""
        data = None if body is None else json.dumps(body).encode()
        try:
            answer = self._http.request("GET" if data is None else "POST", self.url + path, data, self.timeout)
        except http.TooLarge as e:
            raise EngineError(str(e)) from None
        except http.TIMEOUTS:
            raise EngineError(f"{self.url}{path}: no complete answer within {self.timeout:g} s") from None
        except httpx.TransportError as e:
            raise EngineError(
                f"{self.url}: cannot reach the vLLM server ({http.shown(str(e) or type(e).__name__, self.token)})"
            ) from None
        if answer.status >= 300:
            raise EngineError(f"{self.url}{path}: HTTP {answer.status}: {_server_message(answer.body, self.token)}")
        try:
            return json.loads(answer.body)
        except (ValueError, RecursionError):
            raise EngineError(f"{self.url}{path}: the answer is not JSON (not a vLLM server?)") from None

    def _complete(self, key: str, prompt: list[int], spec: dict) -> None:
        self._request(
            "/v1/completions",
            {
                "model": self.model_id,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "cache_salt": key,
                "vllm_xargs": {wire.SPEC_KEY: wire.served(spec, self.exchange, self.token)},
            },
        )

    def _probe(self) -> dict:
        key = wire.probe_key(wire.new_run())
        self._complete(key, [0, 0], wire.probe_spec(key))
        answer = self._wait(
            wire.exchange_path(self.exchange, key, "json"), wire.exchange_path(self.exchange, key, "err")
        )
        if answer is None:
            raise EngineError(self._no_answer())
        try:
            with open(answer) as f:
                text = f.read()
        finally:
            os.unlink(answer)
        if answer.endswith(".err"):
            raise EngineError(f"{self.url}: {text.strip()}")
        info = json.loads(text)
        if info.get("wire") != wire.VERSION:
            raise EngineError(
                f"{self.url}: the server's kldtool speaks wire protocol version {info.get('wire', 1)}, "
                f"this one {wire.VERSION}: install the same kldtool on both"
            )
        theirs = info.get("statistics")
        if theirs != list(FIELDS):
            # the server's answer is checked before it is used: only a list of names is compared
            named = isinstance(theirs, list) and all(isinstance(n, str) for n in theirs)
            differ = sorted(set(FIELDS).symmetric_difference(theirs if named else []))
            shown = ", ".join(map(str, differ[:6])) or "their order"
            raise EngineError(
                f"{self.url}: the server's kldtool records other statistics ({shown} differ): "
                f"install the same kldtool on both"
            )
        return info

    def _no_answer(self) -> str:
        """Why a probe may go unanswered. A request without the server's token is told nothing
        (an answer would let anyone write into the exchange root), so the client names the
        token first where its own could be the cause."""
        hook_off = (
            f"the server runs without kldtool's hook (its operator starts it with KLDTOOL_VLLM_HOOK=1, "
            f"KLDTOOL_VLLM_BASE_ROOTS and a KLDTOOL_VLLM_EXCHANGE_ROOT that holds --exchange-dir, now "
            f"{self.exchange}, with kldtool installed beside vLLM)"
        )
        if self.token:
            token = f"this client's {wire.TOKEN} is not the server's (ask its operator for it)"
        else:
            token = f"the server asks for a token and this client sends none (set {wire.TOKEN} to the operator's)"
        return f"{self.url}: no answer from kldtool's hook: either {token}, or {hook_off}"

    @staticmethod
    def _wait(*paths: str) -> str | None:
        """The first of ``paths`` that exists, waiting a little for a slow shared filesystem."""
        deadline = time.monotonic() + result_grace()
        while True:
            for p in paths:
                if os.path.exists(p):
                    return p
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def _run(self, windows: list[Window], mode_for) -> list[dict]:
        keys, specs = window_specs(windows, self.logits_block, mode_for)
        # Sent together so the server batches them, as one generate() call does offline.
        try:
            with ThreadPoolExecutor(max_workers=min(len(windows), MAX_IN_FLIGHT)) as pool:
                list(
                    pool.map(
                        lambda kws: self._complete(*kws),
                        [(k, [int(t) for t in w.tokens], s) for k, w, s in zip(keys, windows, specs)],
                    )
                )
            return [self._collect(k, w) for k, w in zip(keys, windows)]
        except BaseException:
            for k in keys:  # what the other windows of a failed call left in the exchange directory
                for kind in ("npz", "err"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(wire.exchange_path(self.exchange, k, kind))
            raise

    def _collect(self, key: str, w: Window) -> dict:
        arrays, error = wire.exchange_path(self.exchange, key, "npz"), wire.exchange_path(self.exchange, key, "err")
        got = self._wait(arrays, error)
        if got is None:
            raise EngineError(f"{self.url}: window {w.index}: no result in {self.exchange} (see the server's log)")
        try:
            if got == error:
                with open(got) as f:
                    raise EngineError(f"{self.url}: window {w.index}: {f.read().strip()}")
            with np.load(got) as z:
                return {name: z[name] for name in z.files}
        finally:
            os.unlink(got)

    def close(self) -> None:
        self._http.close()
        if self._own_exchange and os.path.isdir(self.exchange):
            shutil.rmtree(self.exchange, ignore_errors=True)


def _server_message(body: bytes, token: str | None) -> str:
    """The server's one-line reason, made safe to print."""
    try:
        parsed = json.loads(body[: 64 << 10])
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        text = str(err.get("message", err) if isinstance(err, dict) else err)
    except Exception:
        text = body[:300].decode("utf-8", "replace")
    return http.shown(text or "(no message)", token)
