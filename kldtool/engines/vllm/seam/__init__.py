"""The one place kldtool touches vLLM: every import of it and every internal it relies on,
in this package (runner.py: the step hooks; workers.py: ranks, the plugin's way in, what the
hook reads of a loaded model; llm.py: the offline engine's LLM). Here: the list of it all.

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

from kldtool.engines.vllm.seam.base import TESTED_VERSIONS, HookUnavailable, log, vllm_version
from kldtool.engines.vllm.seam.items import SEAM
from kldtool.engines.vllm.seam.llm import generate, llm_facts, rpc, sample, start_llm
from kldtool.engines.vllm.seam.runner import StepHook, head_rows, install, raw_spec
from kldtool.engines.vllm.seam.workers import (
    attach,
    attached,
    install_on_worker,
    pp_stage,
    tp_rank,
    worker_facts,
    worker_head,
    wrap_load_model,
)

__all__ = [
    "SEAM",
    "TESTED_VERSIONS",
    "HookUnavailable",
    "StepHook",
    "log",
    "vllm_version",
    "install",
    "raw_spec",
    "head_rows",
    "tp_rank",
    "pp_stage",
    "wrap_load_model",
    "worker_facts",
    "install_on_worker",
    "worker_head",
    "attach",
    "attached",
    "start_llm",
    "llm_facts",
    "generate",
    "sample",
    "rpc",
]
