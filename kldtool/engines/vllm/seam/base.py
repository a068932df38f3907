"""What every part of the seam shares: its logger, its error, the vLLM version."""

from __future__ import annotations

import logging

# A child of vLLM's logger: the hook's lines appear among the server's own, in its format.
log = logging.getLogger("vllm.kldtool")
TESTED_VERSIONS = ("0.32",)


class HookUnavailable(RuntimeError):
    pass


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")
