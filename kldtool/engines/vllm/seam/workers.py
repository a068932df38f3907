"""vLLM's workers: which of them keeps results (tensor-parallel rank, pipeline stage), where
the plugin's hook goes in, and what the hook reads of a loaded model."""

from __future__ import annotations

from typing import Callable

from kldtool.engines.vllm.seam.base import HookUnavailable, log, vllm_version
from kldtool.engines.vllm.seam.runner import StepHook, _guarded, head_rows, install


# Where vLLM has kept get_tensor_model_parallel_rank, newest first.
RANK_MODULES = ("vllm.backends.distributed", "vllm.distributed")


def _distributed(attr: str):
    """vLLM's ``attr`` from where it lives now or lived before, or None."""
    import importlib

    for name in RANK_MODULES:
        try:
            fn = getattr(importlib.import_module(name), attr, None)
        except ImportError:
            continue
        if fn is not None:
            return name, fn
    return None


def tp_rank() -> int:
    """This worker's tensor-parallel rank. Only rank 0 keeps results, so a wrong answer would
    make every rank keep them (or none): no silent default. vLLM's own function where it
    lives now or lived before, else torch's default group; none of them is an error."""
    found = _distributed("get_tensor_model_parallel_rank")
    if found is not None:
        name, fn = found
        try:
            return int(fn())
        except AssertionError as e:  # vLLM's "group is not initialized"
            raise HookUnavailable(f"vLLM {vllm_version()}: {name}.get_tensor_model_parallel_rank: {e}") from None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    raise HookUnavailable(
        f"vLLM {vllm_version()}: no get_tensor_model_parallel_rank in {' or '.join(RANK_MODULES)} "
        f"and no torch.distributed group: cannot tell which worker keeps the results"
    )


def pp_stage() -> tuple[bool, bool]:
    """(first, last): where this worker sits in the pipeline. Only the last stage computes
    logits; a wrong answer would let an earlier stage report windows it never saw."""
    found = _distributed("get_pp_group")
    if found is None:
        raise HookUnavailable(
            f"vLLM {vllm_version()}: no get_pp_group in {' or '.join(RANK_MODULES)}: "
            f"cannot tell the pipeline stage that computes logits"
        )
    name, fn = found
    try:
        group = fn()
    except AssertionError as e:
        raise HookUnavailable(f"vLLM {vllm_version()}: {name}.get_pp_group: {e}") from None
    return bool(group.is_first_rank), bool(group.is_last_rank)


def wrap_load_model(after: Callable) -> bool:
    """Make every worker of this process call ``after(worker)`` once its model has loaded;
    False where vLLM's worker class cannot be imported. Idempotent: vLLM loads plugins once per
    process, but more than one process may share this module."""
    try:
        # The worker class of CUDA, ROCm and CPU (CPUWorker inherits its load_model).
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as e:
        log.error("kldtool: vLLM's worker class cannot be imported (%s): no hook", e)
        return False
    if getattr(Worker.load_model, "_kldtool", False):
        return True
    original = Worker.load_model

    def load_model(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _guarded("installing the hook", after, self)

    load_model._kldtool = True
    Worker.load_model = load_model
    return True


def worker_facts(worker) -> dict:
    """What the hook needs to know of a worker's loaded model and layout (plain values)."""
    config = worker.vllm_config
    model = config.model_config
    return {
        "vllm": vllm_version(),
        "device": str(worker.model_runner.device),
        "n_vocab": int(model.get_vocab_size()),
        "hidden_size": int(model.get_hidden_size()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "tensor_parallel_size": int(config.parallel_config.tensor_parallel_size),
        "pipeline_parallel_size": int(config.parallel_config.pipeline_parallel_size),
        "prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "batch_invariant": batch_invariant(),
    }


def batch_invariant() -> bool:
    """Whether vLLM runs in its batch-invariant mode (``VLLM_BATCH_INVARIANT=1``), in which a
    request's logits do not depend on what else its batch holds."""
    try:
        import vllm.envs as envs

        return bool(envs.VLLM_BATCH_INVARIANT)
    except Exception:  # a vLLM without the setting
        return False


def install_on_worker(worker, hook: StepHook, first_stage: bool) -> tuple[str, str]:
    """(the runner's class name, the runner generation hooked)."""
    runner = worker.model_runner
    return type(runner).__name__, install(runner, hook, first_stage)


def worker_head(worker) -> dict:
    return head_rows(worker.model_runner.model)


def attach(worker, state) -> None:
    worker._kldtool = state


def attached(worker):
    """The hook's state on ``worker``, or None before it was installed."""
    return getattr(worker, "_kldtool", None)
