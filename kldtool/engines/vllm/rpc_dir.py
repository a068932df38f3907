"""A directory of the run's own for the socket files of vLLM's processes.

vLLM names the ZMQ sockets between its processes (the engine core, each rank's worker) as files
under VLLM_RPC_BASE_PATH, the system's temporary directory unless set. A socket's file is
removed only when the process that bound it closes it, and the ranks vLLM stops at the end of a
run are terminated first: each run over three ranks left eight socket files in /tmp, so a sweep
of many quants would leave hundreds. Where the user has not chosen the path, each engine gets a
directory of its own, removed when the engine closes or the process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

VAR = "VLLM_RPC_BASE_PATH"
# A Unix socket's path holds at most 107 bytes; vLLM adds "/" and a 36-character uuid.
MAX_DIR = 107 - 37
_OURS: set[str] = set()  # directories this process made: another engine's is not the user's choice


class RpcDir:
    """Sets VLLM_RPC_BASE_PATH to a fresh directory for as long as it is held."""

    def __init__(self) -> None:
        self.path: str | None = None
        if os.environ.get(VAR) and os.environ[VAR] not in _OURS:
            return
        path = tempfile.mkdtemp(prefix="kldtool-vllm-")
        if len(path) > MAX_DIR:  # vLLM's own default then, as long as it fits there
            os.rmdir(path)
            return
        self.path = path
        _OURS.add(path)
        os.environ[VAR] = path
        atexit.register(self.remove)

    def remove(self) -> None:
        """Remove the directory (its sockets' processes have ended) and the setting, if still ours."""
        if self.path is None:
            return
        atexit.unregister(self.remove)
        _OURS.discard(self.path)
        if os.environ.get(VAR) == self.path:
            del os.environ[VAR]
        shutil.rmtree(self.path, ignore_errors=True)
        self.path = None
