"""Everything of vLLM's that kldtool relies on, as (source file, class or "" for the module,
member, parameters a method must start with, or None for an attribute or field).
scripts/vllm_seam_check.py reads a vLLM source tree or wheel against it, so a new release is
checked before anyone runs it; tests/test_package_shape.py checks that the seam reads nothing
of vLLM's that is not listed here."""

from __future__ import annotations

_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_V2 = "vllm/v1/worker/gpu/"
SEAM = (
    # the runner-v1 step and what it knows of each request
    (_RUNNER, "GPUModelRunner", "_get_prompt_logprobs_dict", ("self", "hidden_states", "num_scheduled_tokens")),
    *(
        (_RUNNER, "GPUModelRunner", f, None)
        for f in (
            "query_start_loc",
            "requests",
            "input_batch",
            "model",
            "device",
            "model_config",
            "intermediate_tensors",
            "max_num_tokens",
        )
    ),
    ("vllm/v1/utils.py", "CpuGpuBuffer", "np", None),
    ("vllm/v1/worker/gpu_input_batch.py", "InputBatch", "req_id_to_index", None),
    *(
        ("vllm/v1/worker/gpu_input_batch.py", "CachedRequestState", f, None)
        for f in ("prompt_token_ids", "sampling_params", "num_computed_tokens")
    ),
    # the runner-v2 step
    (_V2 + "model_runner.py", "GPUModelRunner", "prompt_logprobs_worker", None),
    (
        _V2 + "sample/prompt_logprob.py",
        "PromptLogprobsWorker",
        "add_request",
        ("self", "req_id", "req_idx", "sampling_params"),
    ),
    (_V2 + "sample/prompt_logprob.py", "PromptLogprobsWorker", "remove_request", ("self", "req_id")),
    (
        _V2 + "sample/prompt_logprob.py",
        "PromptLogprobsWorker",
        "compute_prompt_logprobs",
        ("self", "logits_fn", "hidden_states", "input_batch", "all_token_ids", "num_computed_tokens", "prompt_lens"),
    ),
    *(
        (_V2 + "input_batch.py", "InputBatch", f, None)
        for f in (
            "req_ids",
            "idx_mapping_np",
            "prefill_len_np",
            "num_computed_prefill_tokens_np",
            "query_start_loc_np",
            "num_scheduled_tokens",
        )
    ),
    # the model: logits, the pipeline's activation buffer, the output head (base --store hidden)
    (
        "vllm/model_executor/models/interfaces_base.py",
        "VllmModelForTextGeneration",
        "compute_logits",
        ("self", "hidden_states"),
    ),
    ("vllm/model_executor/models/interfaces.py", "SupportsPP", "make_empty_intermediate_tensors", None),
    *(("vllm/model_executor/models/llama.py", "LlamaForCausalLM", f, None) for f in ("lm_head", "logits_processor")),
    ("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbedding", "shard_indices", None),
    *(
        ("vllm/model_executor/layers/vocab_parallel_embedding.py", "VocabParallelEmbeddingShardIndices", f, None)
        for f in ("org_vocab_start_index", "org_vocab_end_index")
    ),
    *(
        ("vllm/model_executor/layers/logits_processor.py", "LogitsProcessor", f, None)
        for f in ("scale", "soft_cap", "org_vocab_size", "logits_as_input")
    ),
    # which worker keeps results
    ("vllm/distributed/parallel_state.py", "", "get_tensor_model_parallel_rank", ()),
    ("vllm/distributed/parallel_state.py", "", "get_pp_group", ()),
    *(
        ("vllm/distributed/parallel_state.py", "GroupCoordinator", f, ("self",))
        for f in ("is_first_rank", "is_last_rank")
    ),
    # the worker: where the plugin hooks in, and what it reads of the loaded model
    ("vllm/v1/worker/gpu_worker.py", "Worker", "load_model", ("self",)),
    ("vllm/v1/worker/gpu_worker.py", "Worker", "model_runner", None),
    ("vllm/v1/worker/worker_base.py", "WorkerBase", "vllm_config", None),
    *(("vllm/config/vllm.py", "VllmConfig", f, None) for f in ("model_config", "parallel_config", "cache_config")),
    *(("vllm/config/model.py", "ModelConfig", f, ("self",)) for f in ("get_vocab_size", "get_hidden_size")),
    *(("vllm/config/model.py", "ModelConfig", f, None) for f in ("dtype", "hf_text_config", "max_model_len")),
    *(
        ("vllm/config/parallel.py", "ParallelConfig", f, None)
        for f in ("tensor_parallel_size", "pipeline_parallel_size", "worker_extension_cls")
    ),
    ("vllm/config/cache.py", "CacheConfig", "enable_prefix_caching", None),
    ("vllm/envs.py", "", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", None),
    ("vllm/envs.py", "", "VLLM_BATCH_INVARIANT", None),  # reported to served clients: optional
    # the offline engine: an LLM, its requests and its workers' RPC
    *(("vllm/entrypoints/llm.py", "LLM", f, None) for f in ("llm_engine",)),
    *(("vllm/entrypoints/llm.py", "LLM", f, ("self",)) for f in ("generate", "collective_rpc", "get_tokenizer")),
    ("vllm/v1/engine/llm_engine.py", "LLMEngine", "model_config", None),
    ("vllm/inputs/llm.py", "TokensPrompt", "prompt_token_ids", None),
    *(
        ("vllm/sampling_params.py", "SamplingParams", f, None)
        for f in ("extra_args", "max_tokens", "temperature", "detokenize")
    ),
    # kldtool generate: sampled answers, their ids and why they ended
    *(
        ("vllm/sampling_params.py", "SamplingParams", f, None)
        for f in ("top_p", "top_k", "min_p", "seed", "repetition_penalty")
    ),
    ("vllm/outputs.py", "RequestOutput", "outputs", None),
    *(("vllm/outputs.py", "CompletionOutput", f, None) for f in ("token_ids", "finish_reason")),
)
