"""llama-cpp-python's OpenAI-compatible server (its [server] extra) on 127.0.0.1, for the
endpoint engine's tests: a stock server, nothing of kldtool in it."""

import contextlib
import os
import sys

from helpers.server_process import free_port, server_process


@contextlib.contextmanager
def served_gguf(model, log_dir, n_ctx: int = 512, flash_attn: bool = False, alias: str | None = None):
    """`python -m llama_cpp.server` for one GGUF, one thread (a CI machine has two cores); listed
    under ``alias`` where given (a provider that names one model and serves another)."""
    port = free_port()
    log_path = os.path.join(log_dir, f"llama-server-{port}.log")
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "1", "--flash_attn", str(flash_attn).lower()]
    argv += ["--model_alias", alias] if alias else []
    with open(log_path, "w") as log, server_process(argv, port, log, log_path, seconds=120) as url:
        yield url
