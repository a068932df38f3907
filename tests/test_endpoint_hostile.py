"""`compare --endpoint` against servers that answer wrongly: a stand-in HTTP server on 127.0.0.1
(a remote host that misbehaves cannot be had here otherwise) answering what a broken or hostile
server could. Each run ends in one line naming the server, exit 6, no traceback and no file."""

import contextlib
import http.server
import json
import threading

import pytest

from conftest import run_cli

pytestmark = pytest.mark.quick

K = 20


def _row(want: int, bad: str) -> dict:
    """One position's prompt log-probs: the top K (ids 0..K-1) and the prompt's own token."""
    row = {str(t): {"logprob": -1.0 - 0.1 * t, "rank": t + 1} for t in range(K)}
    row.setdefault(str(want), {"logprob": -9.0, "rank": 500})
    if bad == "nan":
        row["0"]["logprob"] = float("nan")
    elif bad == "positive":
        row["1"]["logprob"] = 3.0
    elif bad == "ids":
        row["1000000"] = row.pop("1")
    return row


class Stand(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, body: bytes, status: int = 200):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        bad, model = self.server.bad, self.server.model
        self._send(
            b'{"data": "none"}' if bad == "models" else json.dumps({"data": [{"id": "m", "root": model}]}).encode()
        )

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, k, bad = req["prompt"], req["prompt_logprobs"], self.server.bad
        if k > K:
            return self._send(json.dumps({"error": {"message": f"max allowed: {K}"}}).encode(), 400)
        window = len(prompt) > 16  # the client's probes are a few tokens; its windows 128
        if bad == "deep" and window:
            return self._send(b"[" * 100000 + b"]" * 100000)
        rows = [None] + [_row(t, bad) for t in prompt[1:]]
        if bad == "short" and window:
            rows = rows[: len(rows) // 2]
        self._send(json.dumps({"choices": [{"prompt_logprobs": rows}]}).encode())


@contextlib.contextmanager
def stand_in(bad: str, model: str):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stand)
    server.bad, server.model = bad, model
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "bad, says",
    [
        ("models", "/v1/models: no model list (not an OpenAI-compatible server?)"),
        ("nan", "the answer holds values that are not log-probs"),
        ("positive", "the answer holds values that are not log-probs"),
        ("ids", "the answer names token ids outside the vocabulary"),
        ("deep", "the answer is not JSON"),
        ("short", "prompt log-probs for a prompt of 128 tokens (truncated?)"),
    ],
)
def test_a_server_that_answers_wrongly_is_one_line(fp32_dir, hf_base, tmp_path, bad, says):
    with stand_in(bad, str(fp32_dir)) as url:
        args = ("--kl-divergence-base", hf_base, "--chunks", 1, "--json", tmp_path / "r.json")
        p = run_cli("compare", "--endpoint", url, *args, check_rc=6)
    lines = [line for line in p.stderr.strip().splitlines() if not line.startswith("compare:")]
    assert len(lines) == 1 and lines[0].startswith(f"kldtool: error: {url}") and says in lines[0], lines
    assert "Traceback" not in p.stderr and not list(tmp_path.iterdir())
