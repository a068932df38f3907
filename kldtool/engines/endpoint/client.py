"""An HTTP client that behaves on someone else's server: a timeout per request, retries with
exponential backoff and jitter on 429, 5xx and dropped connections (a server's Retry-After
honoured, up to a bound), and every failure one line naming the server. The API key comes from
the environment and goes only into the Authorization header: never into a message, a file or
a manifest."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import time
import urllib.error
import urllib.request

from kldtool.errors import EngineError

KEY_VARIABLES = ("KLDTOOL_ENDPOINT_KEY", "OPENAI_API_KEY")  # the first one set is sent
RETRIES = 6
BACKOFF_S = 0.5  # the first wait; doubled each retry, with up to as much again of jitter
MAX_WAIT_S = 30.0  # the longest wait, whatever Retry-After asks
RETRIED = {429, 500, 502, 503, 504}
MAX_ANSWER_BYTES = 256 << 20  # a window of 4,096 positions with 256 log-probs each is about 60 MB


class HttpError(EngineError):
    """A status the client does not retry (or that stayed after every retry)."""

    def __init__(self, status: int, message: str, line: str):
        super().__init__(line)
        self.status, self.message = status, message


class Client:
    def __init__(self, url: str, timeout: float = 300.0, retries: int = RETRIES, seed: int | None = None):
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout, self.retries = timeout, retries
        self._key = next((os.environ[v] for v in KEY_VARIABLES if os.environ.get(v)), None)
        self._rng = random.Random(seed)
        self.retried = 0  # requests sent again, over the client's life
        self.reached = False  # a server that refused every connection so far is not retried

    def get(self, path: str) -> dict:
        return self._send(path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._send(path, json.dumps(body).encode())

    def _send(self, path: str, data: bytes | None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url + path, data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    body = r.read(MAX_ANSWER_BYTES + 1)
                self.reached = True
                if len(body) > MAX_ANSWER_BYTES:
                    raise EngineError(f"{self.url}{path}: an answer of more than {MAX_ANSWER_BYTES >> 20} MiB")
                try:
                    return json.loads(body)
                except (ValueError, RecursionError):
                    raise EngineError(
                        f"{self.url}{path}: the answer is not JSON (not an OpenAI-compatible server?)"
                    ) from None
            except urllib.error.HTTPError as e:
                self.reached = True
                message = _message(e)
                if e.code not in RETRIED or attempt == self.retries:
                    raise HttpError(e.code, message, f"{self.url}{path}: HTTP {e.code}: {message}") from None
                self._wait(attempt, e.headers.get("Retry-After"))
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
                reason = getattr(e, "reason", e)
                # nothing listening, or no such host: not there, so not retried; a connection
                # taken and then dropped is a server there, having a bad moment
                if not self.reached and isinstance(reason, (ConnectionRefusedError, socket.gaierror)):
                    raise EngineError(f"{self.url}: cannot reach the server ({reason})") from None
                if attempt == self.retries:
                    raise EngineError(f"{self.url}: no answer after {self.retries + 1} tries ({reason})") from None
                self._wait(attempt, None)
        raise AssertionError("unreachable")

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        self.retried += 1
        wait = BACKOFF_S * 2**attempt
        wait += self._rng.uniform(0, wait)
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:  # an HTTP date: the backoff stands
                pass
        time.sleep(min(wait, MAX_WAIT_S))


def _message(e: urllib.error.HTTPError) -> str:
    """The server's own one-line reason, where its body has one."""
    try:
        body = json.loads(e.read(64 << 10))
        err = body.get("error", body) if isinstance(body, dict) else body
        text = err.get("message", err) if isinstance(err, dict) else err
        return str(text).splitlines()[0][:300] if str(text).strip() else str(e.reason)
    except Exception:
        return str(e.reason)
