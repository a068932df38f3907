"""The HTTP client under `--endpoint` and `--server` (kldtool/runtime/http.py, issue 79), against
stand-in servers on 127.0.0.1 that redirect, trickle or never answer: the key never leaves its
origin (the second server's own record proves it), every request ends at its deadline whatever
the server does, and what a server says reaches the terminal as one safe line."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import time

import pytest

from conftest import run_cli
from helpers.endpoint_stand import KEY, stand_in
from kldtool.engines.endpoint.client import Client
from kldtool.errors import EngineError, UsageError
from kldtool.runtime import http as kh

pytestmark = pytest.mark.quick


class Odd(http.server.BaseHTTPRequestHandler):
    """Answers by path: /to/URL redirects there (302), /same redirects to /v1/models on this
    server, /trickle sends a byte every TRICKLE_S, /silent accepts and never answers,
    /headers trickles its status line; anything else is a model list. Records what it is sent."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/to/"):
            self._redirect(self.path[4:])
        elif self.path.startswith("/same"):
            self._redirect("/v1/models")
        elif self.path.startswith("/trickle"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self._drip(b"x" * 1000)
        elif self.path == "/headers":
            self._drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        elif self.path == "/silent":
            self.server.stop.wait(60)
        else:
            body = json.dumps({"data": [{"id": "m"}], "where": self.server.name}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def _redirect(self, location: str):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _drip(self, data: bytes):
        for i in range(len(data)):
            if self.server.stop.wait(0.5):
                return
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:
                return


@contextlib.contextmanager
def odd(name: str):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    server.daemon_threads = True
    server.seen, server.name, server.stop = [], name, threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("KLDTOOL_ENDPOINT_KEY", KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_a_redirect_is_not_followed_unless_asked(keyed):
    with odd("a") as (a, seen_a), odd("b") as (b, seen_b):
        with pytest.raises(EngineError) as e:
            Client(a).get(f"/to/{b}/v1/models")
        line = str(e.value)
        assert f"the server redirects to {b}" in line and "--endpoint-follow-redirects" in line and KEY not in line
        assert seen_b == [] and seen_a == [(f"/to/{b}/v1/models", f"Bearer {KEY}")]


def test_a_followed_redirect_keeps_the_key_at_home(keyed):
    with odd("a") as (a, seen_a), odd("b") as (b, seen_b):
        client = Client(a, follow_redirects=True)
        assert client.get("/same")["where"] == "a"  # same origin: followed, the key sent again
        assert seen_a == [("/same", f"Bearer {KEY}"), ("/v1/models", f"Bearer {KEY}")]
        assert client.get(f"/to/{b}/v1/models")["where"] == "b"  # another port: followed, no key
        assert seen_b == [("/v1/models", None)]


def test_redirect_rules():
    assert (
        kh.refused_redirect("https://h:1/x", "http://h:1/y")
        == "a redirect from https to http (http://h:1): not followed"
    )
    assert "not an HTTP URL" in kh.refused_redirect("http://h/x", "file:///etc/passwd")
    assert kh.refused_redirect("http://h/x", "https://other/y") is None
    assert kh.origin("http://H:80/a") == kh.origin("http://h/b") != kh.origin("https://h/b")


@pytest.mark.parametrize("path", ["/trickle", "/headers", "/silent"])
def test_a_request_ends_at_its_deadline_whatever_the_server_does(path):
    """A body trickled a byte every 0.5 s, a status line trickled, a server that never answers:
    each request ends at its 2-second deadline (retries and their waits inside it)."""
    with odd("a") as (a, _):
        client = Client(a, timeout=2.0)
        t = time.monotonic()
        with pytest.raises(EngineError) as e:
            client.get(path)
        took = time.monotonic() - t
    line = str(e.value)
    assert "no complete answer; gave up after 1 try in " in line and "within --endpoint-timeout 2 s" in line, line
    printed = float(re.search(r"in ([0-9.]+) s \(", line).group(1))
    assert 1.8 <= printed <= 2.2 and took <= 2.2, (printed, took)


def test_the_cli_cuts_a_trickling_server_at_endpoint_timeout(fp32_dir, hf_base, tmp_path):
    """`compare --endpoint URL --endpoint-timeout 3` against a server that trickles its model
    list: one line, exit 6, the total it printed within 10 % of 3 s, no file."""
    with odd("a") as (a, _):
        p = run_cli(
            "compare", "--endpoint", f"{a}/trickle-all", "--endpoint-timeout", 3, "--kl-divergence-base", hf_base,
            "--json", tmp_path / "r.json", check_rc=6,
        )  # fmt: skip
    (line,) = [x for x in p.stderr.strip().splitlines() if not x.startswith("compare:")]
    printed = float(re.search(r"in ([0-9.]+) s \(", line).group(1))
    assert "no complete answer" in line and 2.7 <= printed <= 3.3, line
    assert not list(tmp_path.glob("r.json"))


@pytest.mark.full_tier
def test_the_cli_never_sends_the_key_across_origins(fp32_dir, hf_base, tmp_path):
    """A server whose every path redirects to another port's real stand-in: without the flag one
    line naming the redirect; with it, the run completes against the second server, whose own
    record shows it never received the key."""
    seen: list = []
    with stand_in("", str(fp32_dir), seen) as b, odd("a") as (a, seen_a):
        env = {"KLDTOOL_ENDPOINT_KEY": KEY}
        args = ("compare", "--endpoint", f"{a}/to/{b}", "--kl-divergence-base", hf_base, "--chunks", 1)
        p = run_cli(*args, check_rc=6, env_extra=env)
        assert f"the server redirects to {b}" in p.stderr and seen == [] and KEY not in p.stderr
        p = run_cli(*args, "--endpoint-follow-redirects", "--json", tmp_path / "r.json", env_extra=env)
    assert json.loads((tmp_path / "r.json").read_text())["statistics"]["kld_mean"]["value"] >= 0
    assert seen and all(auth is None for _, _, auth in seen), seen
    assert all(auth == f"Bearer {KEY}" for _, auth in seen_a)


def test_a_url_with_credentials_is_refused_without_echoing_them(hf_base):
    with pytest.raises(UsageError) as e:
        kh.checked_url("http://user:hunter2@127.0.0.1:9/v1", "--endpoint")
    assert "hunter2" not in str(e.value) and "KLDTOOL_ENDPOINT_KEY" in str(e.value)
    p = run_cli("compare", "--endpoint", "http://user:hunter2@127.0.0.1:9", "--kl-divergence-base", hf_base, check_rc=2)
    assert "hunter2" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_what_a_server_says_is_shown_as_one_safe_line():
    said = f"bad key {KEY}\n\x1b[2J\x1b]0;pwned\x07 \u202e{'x' * 500}"
    line = kh.shown(said, KEY)
    assert KEY not in line and "***" in line and "\n" not in line and len(line) <= kh.SHOWN_CHARS
    assert not any(ord(c) < 32 or c == "\x7f" for c in line) and "\\x1b[2J" in line
