"""kldtool's vLLM general plugin (entry point ``vllm.general_plugins``: ``kldtool``).

vLLM runs every general plugin in each of its processes, workers included, before it builds
the worker. With ``KLDTOOL_VLLM_HOOK=1`` in the server's environment this one makes each
worker install the hook (worker.install) once its model has loaded, under the operator's
settings (policy.py). A served model has no collective_rpc a client may call, which is why the
hook installs itself here rather than through ``--worker-extension-cls``. Without the variable
the plugin does nothing: installing kldtool next to a server changes nothing unless its
operator asks.
"""

from __future__ import annotations

import os

from kldtool.engines.vllm.policy import SETTINGS, enabled

# vLLM's Ray executor gives its actors only the environment variables it is told to copy.
RAY_COPY = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def register() -> None:
    if not enabled():
        return
    # In the process that starts Ray workers (here, on the head node) this makes vLLM hand the
    # settings to every Ray actor, on every node, before the actor loads its plugins.
    copied = [v for v in os.environ.get(RAY_COPY, "").split(",") if v.strip()]
    os.environ[RAY_COPY] = ",".join([*copied, *(v for v in SETTINGS if v not in copied and v in os.environ)])
    from kldtool.engines.vllm import seam

    seam.wrap_load_model(_install)


def _install(worker) -> None:
    from kldtool.engines.vllm import seam
    from kldtool.engines.vllm.policy import Policy
    from kldtool.engines.vllm.worker import install

    seam.log.info("kldtool: hook installed (%s)", install(worker, Policy.from_environment()))
