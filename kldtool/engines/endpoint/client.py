"""A client that behaves on someone else's server (runtime/http.py underneath): one total
deadline per request, retries included (``--endpoint-timeout``); retries with exponential
backoff and jitter on 429, 5xx and dropped connections (a server's Retry-After honoured, up to
a bound), bounded in count and by that deadline; every failure one line naming the server.

The API key comes from the environment and goes only into the Authorization header of requests
to the server's own origin: never into a message, a file or a manifest, never after a redirect
to another origin. Whatever a server says is shown only through ``http.shown``.
"""

from __future__ import annotations

import json
import math
import os
import random
import time

import httpx

from kldtool.errors import AccessDenied, EngineError
from kldtool.runtime import http

KEY_VARIABLES = ("KLDTOOL_ENDPOINT_KEY", "OPENAI_API_KEY")  # the first one set is sent
RETRIES = 6
TIMEOUT_S = 300.0  # a request's deadline, its retries and their waits included
BACKOFF_S = 0.5  # the first wait; doubled each retry, with up to as much again of jitter
MAX_WAIT_S = 30.0  # the longest wait, whatever Retry-After asks
RETRIED = {429, 500, 502, 503, 504}
MAX_ANSWER_BYTES = 256 << 20  # a window of 4,096 positions with 256 log-probs each is about 60 MB


class HttpError(EngineError):
    """A status the client does not retry (or that stayed after every retry)."""

    def __init__(self, status: int, message: str, line: str):
        super().__init__(line)
        self.status, self.message = status, message


class KeyRefused(HttpError, AccessDenied):
    """HTTP 401 or 403: the key is missing or not the server's (exit code 61)."""


class Client:
    def __init__(
        self,
        url: str,
        timeout: float = TIMEOUT_S,
        retries: int = RETRIES,
        seed: int | None = None,
        follow_redirects: bool = False,
    ):
        self.url = http.checked_url(url, "--endpoint").rstrip("/").removesuffix("/v1")
        self.timeout, self.retries = timeout, retries
        self._key = next((os.environ[v] for v in KEY_VARIABLES if os.environ.get(v)), None)
        self._rng = random.Random(seed)
        self._http = http.Http(follow_redirects)
        self.retried = 0  # requests sent again, over the client's life
        self.reached = False  # a server that refused every connection so far is not retried

    def shown(self, text) -> str:
        return http.shown(text, self._key)

    def get(self, path: str) -> dict:
        return self._send("GET", path, None)

    def post(self, path: str, body: dict) -> dict:
        return self._send("POST", path, json.dumps(body).encode())

    def _send(self, method: str, path: str, data: bytes | None) -> dict:
        url, t0 = self.url + path, time.monotonic()
        tries = 0
        while True:
            left = self.timeout - (time.monotonic() - t0)
            tries += 1
            try:
                answer = self._http.request(method, url, data, left, self._key, MAX_ANSWER_BYTES)
            except http.TooLarge as e:
                raise EngineError(self.shown(e)) from None
            except (httpx.TransportError, *http.TIMEOUTS) as e:
                self._gave_up_or_wait(url, e, tries, t0, None)
                continue
            self.reached = True
            if answer.status < 300:
                return self._json(answer.body, url)
            message = self._message(answer)
            if answer.status not in RETRIED:
                kind = KeyRefused if answer.status in (401, 403) else HttpError
                raise kind(answer.status, message, f"{url}: HTTP {answer.status}: {message}")
            self._gave_up_or_wait(url, HttpError(answer.status, message, ""), tries, t0, answer.headers)

    def _gave_up_or_wait(self, url: str, e: Exception, tries: int, t0: float, headers) -> None:
        """Raise the last failure's line if no retry is left in count or in time; else wait."""
        refused = isinstance(e, httpx.ConnectError) and not self.reached
        if refused:  # nothing listening, or no such host: not there, so not retried
            raise EngineError(f"{self.url}: cannot reach the server ({self.shown(_reason(e))})") from None
        spent = time.monotonic() - t0
        wait = self._backoff(tries - 1, headers.get("Retry-After") if headers is not None else None)
        timed_out = isinstance(e, http.TIMEOUTS) or spent + wait >= self.timeout
        if tries > self.retries or timed_out:
            what = (
                f"HTTP {e.status}: {e.message}"
                if isinstance(e, HttpError)
                else ("no complete answer" if isinstance(e, http.TIMEOUTS) else self.shown(_reason(e)))
            )
            raise EngineError(
                f"{url}: {what}; gave up after {tries} {'try' if tries == 1 else 'tries'} in {spent:.1f} s "
                f"(at most {self.retries + 1} tries within --endpoint-timeout {self.timeout:g} s)"
            ) from None
        self.retried += 1
        time.sleep(wait)

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        wait = BACKOFF_S * 2**attempt
        wait += self._rng.uniform(0, wait)
        if retry_after:
            try:
                asked = float(retry_after)
                if math.isfinite(asked):
                    wait = max(wait, asked)
            except ValueError:  # an HTTP date: the backoff stands
                pass
        return min(wait, MAX_WAIT_S)

    def _json(self, body: bytes, url: str):
        try:
            return json.loads(body)  # NaN and Infinity parse: the forms refuse them, naming the position
        except (ValueError, RecursionError):
            raise EngineError(f"{url}: the answer is not JSON (not an OpenAI-compatible server?)") from None

    def _message(self, answer: http.Answer) -> str:
        """The server's own one-line reason, where its body has one, made safe to print."""
        try:
            body = json.loads(answer.body[: 64 << 10])
            err = body.get("error", body) if isinstance(body, dict) else body
            text = err.get("message", err) if isinstance(err, dict) else err
            text = str(text) if str(text).strip() else answer.headers.get("reason-phrase", "")
        except Exception:
            text = answer.body[:300].decode("utf-8", "replace") or "(no message)"
        return self.shown(text or "(no message)")

    def close(self) -> None:
        self._http.close()


def _reason(e: Exception) -> str:
    return str(e) or type(e).__name__
