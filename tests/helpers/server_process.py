"""A server the tests start on 127.0.0.1: a free port, its output in a log, its whole process
group stopped afterwards, and a wait until it answers /v1/models."""

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(argv, port: int, log, log_path: str, env=None, cwd=None, seconds: float = 300):
    """Start ``argv`` (a server listening on ``port``), yield its URL once it answers."""
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5).read()
                break
            except OSError:
                assert p.poll() is None, open(log_path).read()[-3000:]
                assert time.monotonic() < deadline, f"the server did not come up in {seconds:.0f} s"
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
