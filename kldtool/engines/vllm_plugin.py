"""kldtool's vLLM general plugin (entry point ``vllm.general_plugins``: ``kldtool``).

vLLM runs every general plugin in each of its processes, workers included, before it builds
the worker. With ``KLDTOOL_VLLM_HOOK=1`` in the server's environment this one wraps the
worker's ``load_model`` so that, once the model is loaded, the worker installs the same hook
the offline engine installs through ``collective_rpc`` (vllm_worker.install_on). A served
model has no collective_rpc a client may call, which is why the hook installs itself here
rather than through ``--worker-extension-cls``. Without the variable the plugin does nothing:
installing kldtool next to a server changes nothing unless its operator asks.
"""

from __future__ import annotations

import logging
import os

ENV = "KLDTOOL_VLLM_HOOK"
# vLLM's Ray executor gives its actors only the environment variables it is told to copy.
RAY_COPY = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
log = logging.getLogger("kldtool")


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def register() -> None:
    if not enabled():
        return
    # In the process that starts Ray workers (here, on the head node) this makes vLLM hand the
    # switch to every Ray actor, on every node, before the actor loads its plugins.
    copied = [v for v in os.environ.get(RAY_COPY, "").split(",") if v.strip()]
    if ENV not in copied:
        os.environ[RAY_COPY] = ",".join([*copied, ENV])
    try:
        # The worker class of CUDA, ROCm and CPU (CPUWorker inherits its load_model).
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as e:
        log.error("kldtool: %s=1 but vLLM's worker class cannot be imported (%s): no hook", ENV, e)
        return
    if getattr(Worker.load_model, "_kldtool", False):
        return  # vLLM loads plugins once per process, but more than one process may share this module
    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        original(self, *args, **kwargs)
        from kldtool.engines.vllm_worker import install_on

        log.info("kldtool: hook installed (%s)", install_on(self))

    load_model._kldtool = True
    Worker.load_model = load_model
