"""Cost of kldtool's in-worker KLD on top of vLLM's own scoring of the same windows.

One vLLM instance (the built-in SmolLM2, dtype from --dtype) scores the windows of a base file
twice per round, in alternating order: (a) vLLM alone, ``generate`` with ``prompt_logprobs=0``
(vLLM's plain score mode: the target log-prob of every prompt position), and (b) kldtool's
full compare pipeline on the same instance (the hook computes the logits of the scored
positions, reads and decodes the base rows, reduces on the device, accumulates, prints).
Start-up is excluded from both. Prints the best time of each and their ratio, and appends a
dated row to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/vllm_overhead.py [--ctx 512] [--chunks 40] [--dtype bfloat16] [--rounds 2]
"""

from __future__ import annotations

from base_fixture import base_reader, report, time_both, vllm_args


def main() -> None:
    a = vllm_args(__doc__)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kldtool.engines.vllm.offline import VllmEngine
    from kldtool.text.protocols import llamacpp_windows

    with base_reader(a) as (model, reader, _):
        h = reader.header
        engine = VllmEngine(model, dtype=a.dtype, max_model_len=h.n_ctx + 1, windows_per_call=max(4, 65536 // h.n_ctx))
        windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in w.tokens]) for w in windows]
        plain_params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)

        def plain() -> None:
            engine.llm.generate(prompts, plain_params, use_tqdm=False)

        best = time_both(plain, engine, reader, a.rounds)
        engine.close()
    report(
        a,
        best,
        "vLLM plain prompt_logprobs=0",
        "kldtool compare (vLLM hook)",
        "vLLM compare vs plain prompt_logprobs=0",
    )


if __name__ == "__main__":
    main()
