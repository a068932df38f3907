"""Where a corpus of greedy answers (``kldtool generate --temperature 0``) parts from
transformers' own greedy ``generate`` of the same prompt ids in float32, and whether each parting
is a near-tie: at the first position they differ, both engines' two most likely next tokens and
their log-probabilities (a logit less the same constant, so their gap is the logits' gap), from
vLLM's own sampler (``logprobs=2``) and from transformers' forward of the same ids.
(tests/test_generate.py checks that kldtool's transformers engine answers as ``generate`` does.)

tests/helpers/vllm_jobs.py runs ``ties`` on the engine its commands of the same weights share
(test_vllm_engine.py); benchmarks/greedy_engines.py runs it at size."""

from __future__ import annotations

import json


def samples(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f][1:]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two answers differ (one ending first counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def vllm_top2(llm, ids: list[int]) -> list[tuple[int, float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(max_tokens=1, temperature=0.0, logprobs=2, detokenize=False),
        use_tqdm=False,
    )
    got = out[0].outputs[0].logprobs[0]
    return sorted(((int(t), float(p.logprob)) for t, p in got.items()), key=lambda x: -x[1])[:2]


def transformers_top2(model, ids: list[int]) -> list[tuple[int, float]]:
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return [(int(i), float(v)) for v, i in zip(top.values, top.indices)]


def transformers_greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy answer, ended where the generation config's end-of-sequence ids end it."""
    import torch

    eos = model.generation_config.eos_token_id
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_tokens,
            eos_token_id=eos,
            pad_token_id=eos[0] if isinstance(eos, list) else eos,
            repetition_penalty=1.0,
        )
    return out[0, ids.shape[1] :].tolist()


def ties(llm, model_dir: str, corpus) -> dict:
    """Per sample of vLLM's greedy ``corpus``, equal to transformers' or the first parting with
    both engines' top two."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with open(corpus) as f:
        max_tokens = json.loads(f.readline())["sampling"]["max_tokens"]
    ours, partings = samples(corpus), []
    for k, a in enumerate(ours):
        theirs = transformers_greedy(model, a["prompt_ids"], max_tokens)
        at = first_difference(a["ids"], theirs)
        if at is None:
            continue
        prefix = a["prompt_ids"] + a["ids"][:at]
        v, t = vllm_top2(llm, prefix), transformers_top2(model, prefix)
        partings.append(
            {
                "sample": k,
                "at": at,
                "vllm_chose": a["ids"][at] if at < len(a["ids"]) else None,
                "transformers_chose": theirs[at] if at < len(theirs) else None,
                "vllm_top2": v,
                "transformers_top2": t,
                "vllm_gap": v[0][1] - v[1][1],
                "transformers_gap": t[0][1] - t[1][1],
            }
        )
    return {"samples": len(ours), "tokens": sum(len(s["ids"]) for s in ours), "partings": partings}
