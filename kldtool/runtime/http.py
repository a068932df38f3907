"""HTTP for kldtool's clients of other people's servers (engines/endpoint/client.py, the served
vLLM client), on httpx, with what httpx does not give:

- **A total deadline per request.** httpx's timeouts bound each socket operation, so a server
  that trickles a byte every half second holds a request for as long as it likes. Here every
  connect, read and write of a request is bounded by the time left to its deadline, so the
  request ends at the deadline whatever the server does (``Deadline``).
- **The key stays with its origin.** A redirect is not followed unless asked, and then the key
  goes only to the origin it was given for (never to another host or port, never from https to
  http); a URL with credentials in it is refused rather than printed.
- **Nothing a server says reaches the terminal raw** (``shown``): one line, control characters
  escaped, the key replaced by ``***``, cut to a few hundred characters.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from kldtool.errors import EngineError, UsageError

MAX_REDIRECTS = 5
SHOWN_CHARS = 300

_deadline = threading.local()  # the running request's deadline (time.monotonic), per thread


def _left(kind) -> float:
    end = getattr(_deadline, "at", None)
    if end is None:
        return 3600.0  # outside a request of ours (a connection pool's housekeeping): httpcore's own
    left = end - time.monotonic()
    if left <= 0:
        raise kind("the request's deadline passed")
    return left


def _bounded(timeout: float | None, kind) -> float:
    left = _left(kind)
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    """A connection whose every operation ends by the running request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> "_Stream":
        return _Stream(self.inner.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self):
        self.inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None) -> _Stream:
        t = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self.inner.connect_tcp(host, port, t, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None) -> _Stream:
        return _Stream(self.inner.connect_unix_socket(path, _bounded(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def _transport() -> httpx.HTTPTransport:
    """httpx's own transport over a connection pool whose connections keep the deadline. httpx
    takes no network backend, so its pool is replaced by an equal one that has ours; the
    deadline tests (tests/test_http_client.py) hold this to the installed httpx."""
    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=_Backend())
    return transport


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes
    url: str  # where it came from, after any redirect


class TooLarge(EngineError):
    pass


def origin(url: str) -> tuple[str, str, int | None]:
    u = urlsplit(url)
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, (u.hostname or "").lower(), port


def checked_url(url: str, flag: str) -> str:
    """``url`` as a server's address: http or https, a host, no credentials (refused without
    echoing them: the URL would be printed and logged). One-line UsageError otherwise."""
    try:
        u = urlsplit(url)
        host = u.hostname
        u.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise UsageError(f"{flag}: not a URL") from None
    if u.username is not None or u.password is not None:
        raise UsageError(
            f"{flag}: a URL with credentials in it is refused (they would be printed and logged); "
            f"give the key in KLDTOOL_ENDPOINT_KEY"
        )
    if u.scheme not in ("http", "https") or not host:
        raise UsageError(f"{flag} {shown(url)}: expected an http:// or https:// URL with a host")
    return url


def _printable(c: str) -> str:
    """A character as a terminal line may hold it: itself, a space for a line break or tab, an
    escape for another control byte, ? for any other unprintable character."""
    if c.isprintable():
        return c
    return " " if c in "\r\n\t" else f"\\x{ord(c):02x}" if ord(c) < 256 else "?"


def shown(text, secret: str | None = None, limit: int = SHOWN_CHARS) -> str:
    """A server's text as kldtool prints it: one line, control characters escaped (no escape
    sequence reaches the terminal), ``secret`` replaced by ``***``, at most ``limit`` characters."""
    text = str(text)
    if secret:
        text = text.replace(secret, "***")
    out = "".join(_printable(c) for c in text)
    out = " ".join(out.split())
    if secret:  # a key split by an escape or a cut is still the key's start: never print part of it
        out = out.replace(secret, "***")
    return out if len(out) <= limit else out[: limit - 3] + "..."


class Http:
    """One connection pool; ``request`` sends one request under a total deadline."""

    def __init__(self, follow_redirects: bool = False):
        self.follow = follow_redirects
        self._client = httpx.Client(transport=_transport(), follow_redirects=False, timeout=None)

    def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        seconds: float,
        key: str | None = None,
        limit: int = 256 << 20,
    ) -> Answer:
        """``method url`` with ``body`` (JSON), answered within ``seconds`` in all; the key, if
        any, only to ``url``'s origin. Raises httpx's errors (a timeout at the deadline) and
        TooLarge for an answer over ``limit`` bytes."""
        _deadline.at = time.monotonic() + seconds
        try:
            return self._follow(method, url, body, key, limit)
        finally:
            _deadline.at = None

    def _follow(self, method: str, url: str, body: bytes | None, key: str | None, limit: int) -> Answer:
        home, hops = origin(url), 0
        while True:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            if key and origin(url) == home:
                headers["Authorization"] = f"Bearer {key}"
            with self._client.stream(method, url, content=body, headers=headers) as r:
                if r.is_redirect and "location" in r.headers:
                    target = urljoin(url, r.headers["location"])
                    if not self.follow:
                        raise EngineError(
                            f"{url}: HTTP {r.status_code}: the server redirects to {where(target)} "
                            f"(followed only with --endpoint-follow-redirects)"
                        )
                    hops += 1
                    why = "too many redirects" if hops > MAX_REDIRECTS else refused_redirect(url, target)
                    if why:
                        raise EngineError(f"{url}: HTTP {r.status_code}: {why}")
                    if r.status_code == 303:
                        method, body = "GET", None
                    url = target
                    continue
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"{url}: an answer of more than {limit >> 20} MiB")
                    chunks.append(chunk)
                return Answer(r.status_code, r.headers, b"".join(chunks), url)

    def close(self) -> None:
        self._client.close()


def refused_redirect(current: str, target: str) -> str | None:
    """Why a redirect from ``current`` to ``target`` is not followed, if it is not: only http and
    https, and never from https down to http (the answer, and any key, would cross in clear)."""
    if origin(target)[0] not in ("http", "https") or not origin(target)[1]:
        return f"a redirect to {where(target)}, not an HTTP URL: not followed"
    if origin(current)[0] == "https" and origin(target)[0] == "http":
        return f"a redirect from https to http ({where(target)}): not followed"
    return None


def where(url: str) -> str:
    """A URL as an error names it: scheme, host and port only (no path, query or credentials)."""
    scheme, host, port = origin(url)
    return shown(f"{scheme}://{host}:{port}" if host else "an unnamed place", limit=120)


TIMEOUTS = (httpx.TimeoutException, httpcore.TimeoutException)
