"""A stand-in for an OpenAI-compatible server on 127.0.0.1 that answers vLLM's prompt_logprobs
form, well or as a broken or hostile server would (``bad``), and records what it was sent: each
request's path and Authorization header (tests/test_endpoint_hostile.py, tests/test_http_client.py).
A remote host that misbehaves cannot be had here otherwise."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

K = 20
KEY = "sk-test-0123456789abcdef"


def _row(want: int, bad: str) -> dict:
    """One position's prompt log-probs: the top K (ids 0..K-1) and the prompt's own token."""
    row = {str(t): {"logprob": -3.2 - 0.1 * t, "rank": t + 1} for t in range(K)}  # 0.37 of the mass
    row.setdefault(str(want), {"logprob": -9.0, "rank": 500})
    if bad == "nan":
        row["0"]["logprob"] = float("nan")
    elif bad == "positive":
        row["1"]["logprob"] = 3.0
    elif bad == "ids":
        row["1000000"] = row.pop("1")
    elif bad == "dup":  # "0" and "00" both name id 0: a repeated top-1
        row["00"] = dict(row["0"], rank=K)
        row.pop(str(K - 1))
    elif bad == "mass":  # K entries of log-prob 0: a probability of K
        row = {str(t): {"logprob": 0.0, "rank": t + 1} for t in range(K)}
        row.setdefault(str(want), {"logprob": 0.0, "rank": 1})
    elif bad == "huge":
        row["0"]["logprob"] = -(10**400)
    elif bad == "disagree" and want >= K:  # outside the top K, yet more likely than its K-th
        row[str(want)] = {"logprob": -0.5, "rank": 500}
    return row


class Stand(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _record(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))

    def _send(self, body: bytes, status: int = 200):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._record()
        bad, model = self.server.bad, self.server.model
        self._send(
            b'{"data": "none"}' if bad == "models" else json.dumps({"data": [{"id": "m", "root": model}]}).encode()
        )

    def do_POST(self):
        self._record()
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, k, bad = req["prompt"], req["prompt_logprobs"], self.server.bad
        if bad == "auth":  # a 401 that echoes the key, with an escape sequence
            message = f"Incorrect API key provided: {self.headers.get('Authorization', '')[7:]} \x1b[31mdenied\x1b[0m"
            return self._send(json.dumps({"error": {"message": message}}).encode(), 401)
        if k > K:
            return self._send(json.dumps({"error": {"message": f"max allowed: {K}"}}).encode(), 400)
        window = len(prompt) > 16  # the client's probes are a few tokens; its windows 128
        if bad == "deep" and window:
            return self._send(b"[" * 100000 + b"]" * 100000)
        # the probes get good answers: the windows' answers are the ones refused, by position
        rows = [None] + [_row(t, bad if window else "") for t in prompt[1:]]
        if bad == "short" and window:
            rows = rows[: len(rows) // 2]
        self._send(json.dumps({"choices": [{"prompt_logprobs": rows}]}).encode())


@contextlib.contextmanager
def stand_in(bad: str, model: str, seen: list | None = None):
    """The stand-in's URL while the block runs; ``seen`` collects (method, path, Authorization)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stand)
    server.daemon_threads = True
    server.bad, server.model, server.seen = bad, model, seen if seen is not None else []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
