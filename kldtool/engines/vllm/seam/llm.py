"""The offline engine's vLLM: an LLM in this process, its requests and its workers' RPC."""

from __future__ import annotations

from kldtool.engines.vllm.seam.base import vllm_version
from kldtool.engines.vllm.wire import SPEC_KEY


def start_llm(kwargs: dict):
    from vllm import LLM

    return LLM(**kwargs)


def llm_facts(llm) -> dict:
    config = llm.llm_engine.model_config
    return {
        "vllm": vllm_version(),
        "n_vocab": int(config.get_vocab_size()),
        "n_ctx_train": getattr(config.hf_text_config, "max_position_embeddings", None),
        "max_model_len": config.max_model_len,  # what vLLM takes: prompt and answer together
        "dtype": str(config.dtype).removeprefix("torch."),
        "itemsize": getattr(config.dtype, "itemsize", 4),
        "tokenizer": llm.get_tokenizer(),
    }


def generate(llm, prompts: list[list[int]], specs: list[dict]) -> None:
    """One prompt-scoring request per window: ``max_tokens=1`` and the hook's spec."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        sampling_params=[
            SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, extra_args={SPEC_KEY: s}) for s in specs
        ],
        use_tqdm=False,
    )


def rpc(llm, method: str, *args) -> list:
    """Every worker's answer of ``method`` (worker.KldtoolWorker's)."""
    return llm.collective_rpc(method, args=args)


def sample(llm, prompts: list[list[int]], settings: list[dict]) -> list[tuple[list[int], str | None]]:
    """Sampled answers: per prompt, its SamplingParams' keyword arguments (each with its own seed),
    and back, in the prompts' order, the generated ids and vLLM's finish reason."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        sampling_params=[SamplingParams(detokenize=False, **s) for s in settings],
        use_tqdm=False,
    )
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outputs]
