"""An HTTP proxy on 127.0.0.1 between kldtool's endpoint client and a real server: it drops
connections, answers 429 with Retry-After, or rewrites a request or an answer, as a test asks."""

import contextlib
import http.server
import json
import threading
import urllib.error
import urllib.request


class Proxy(http.server.ThreadingHTTPServer):
    """Every ``drop``-th connection dropped without an answer, every ``throttle``-th answered 429
    with Retry-After (0: never), each POST body passed through ``rewrite`` and each successful
    POST answer through ``respond`` (each a dict to a dict), the rest relayed."""

    def __init__(self, upstream: str, drop: int = 0, throttle: int = 0, rewrite=None, respond=None):
        self.upstream, self.seen, self.lock = upstream, 0, threading.Lock()
        self.drop, self.throttle, self.rewrite, self.respond = drop, throttle, rewrite, respond
        self.keys: set[str] = set()  # the Authorization headers that came through
        self.dropped = self.throttled = 0
        super().__init__(("127.0.0.1", 0), _Relay)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self._relay(None)

    def do_POST(self):
        self._relay(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def _relay(self, body):
        proxy = self.server
        with proxy.lock:
            proxy.seen += 1
            n = proxy.seen
            proxy.keys.add(self.headers.get("Authorization", ""))
        if proxy.drop and n % proxy.drop == 0:
            proxy.dropped += 1
            self.close_connection = True
            self.connection.shutdown(2)  # the connection goes, no answer
            return
        if proxy.throttle and n % proxy.throttle == 0:
            proxy.throttled += 1
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.end_headers()
            return
        if body is not None and proxy.rewrite:
            body = json.dumps(proxy.rewrite(json.loads(body))).encode()
        req = urllib.request.Request(
            proxy.upstream + self.path, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        if body is not None and proxy.respond and status == 200:
            data = json.dumps(proxy.respond(json.loads(data))).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def proxied(upstream: str, **how):
    proxy = Proxy(upstream, **how)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


def flaky(upstream: str):
    """Every fifth connection dropped, every seventh answered 429."""
    return proxied(upstream, drop=5, throttle=7)
