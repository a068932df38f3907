"""Run by the vLLM tests in a fresh process (vLLM spawns workers: keep the __main__ guard).

Scores a base file's windows through kldtool's hook and asks vLLM itself for the same
positions' target log-probs with ``prompt_logprobs=0``; prints both summaries as JSON.

    python tests/helpers/vllm_probe.py MODEL BASE_FILE DTYPE
"""

import json
import sys

import numpy as np


def main() -> None:
    model, base, dtype = sys.argv[1:4]
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from kldtool.engines.vllm import VllmEngine
    from kldtool.logitsfile import open_base_file
    from kldtool.logitsfile.prefetch import PrefetchedChunks
    from kldtool.protocols import llamacpp_windows

    reader = open_base_file(base)
    h = reader.header
    engine = VllmEngine(model, dtype=dtype, max_model_len=h.n_ctx + 1)
    windows = llamacpp_windows(reader.tokens, h.n_ctx, h.n_chunk, engine.bos_id)
    records = engine.score(windows, PrefetchedChunks(reader, range(h.n_chunk)))
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in w.tokens]) for w in windows]
    outs = engine.llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    diffs = []
    for w, out, rec in zip(windows, outs, records):
        own = np.array([out.prompt_logprobs[p + 1][int(w.tokens[p + 1])].logprob
                        for p in range(w.first, w.first + w.n_scored)], dtype=np.float64)
        diffs.append(np.abs(-rec.nll.astype(np.float64) - own))
    kld = np.concatenate([r.kld for r in records])
    print("PROBE " + json.dumps({"tokens": int(sum(len(r) for r in records)), "max_abs_logprob_diff": float(np.concatenate(diffs).max()),
                      "mean_kld": float(kld.mean()), "hooks": engine.hooks}))
    engine.close()


if __name__ == "__main__":
    main()
